"""The README's numbers are the committed figures' tables, not typed-in values: every "value [lo, hi]" it
quotes is a row of some figures/*.csv (a column and its ``_lo``/``_hi``), and the online policy's gap-share
table is figures/07_online_policy__criteria.csv rounded."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from sdlib.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
FIGURES = REPO_ROOT / "figures"
#: "1.032x [1.013, 1.051]" or "0.93 [0.87, 0.99]"
TRIPLE = re.compile(r"(\d+\.\d+)x? \[(\d+\.\d+), (\d+\.\d+)\]")


def _text() -> str:
    return " ".join(README.read_text().split())  # a quote may break across lines


def _triples_in_figures() -> dict[int, set]:
    """{decimals: {(value, lo, hi) rounded}} over every (X, X_lo, X_hi) column triple of figures/*.csv."""
    out: dict[int, set] = {1: set(), 2: set(), 3: set()}

    def add(v, lo, hi):
        for d in out:
            out[d].add((round(v, d), round(lo, d), round(hi, d)))

    for f in sorted(FIGURES.glob("*.csv")):
        df = pd.read_csv(f)
        num = df.apply(pd.to_numeric, errors="coerce")
        for c in df.columns:
            if f"{c}_lo" in df.columns and f"{c}_hi" in df.columns:
                for v, lo, hi in num[[c, f"{c}_lo", f"{c}_hi"]].dropna().to_numpy():
                    add(v, lo, hi)
            elif not pd.api.types.is_numeric_dtype(df[c]) and df[c].astype(str).str.fullmatch(r"\[[-\d.]+, [-\d.]+\]").any():
                # an interval written as text ("[15.1, 16.2]", the serving tables): with each number of its row
                for i, cell in df[c].astype(str).items():
                    m = re.fullmatch(r"\[([-\d.]+), ([-\d.]+)\]", cell)
                    if m:
                        for v in num.loc[i].dropna():
                            add(float(v), float(m.group(1)), float(m.group(2)))
    return out


def test_every_quoted_interval_is_a_row_of_a_figure_table():
    quotes = TRIPLE.findall(_text())
    assert len(quotes) >= 5
    have = _triples_in_figures()
    missing = []
    for q in quotes:
        d = len(q[0].split(".")[1])
        if tuple(round(float(x), d) for x in q) not in have.get(d, set()):
            missing.append(q)
    assert not missing, f"README quotes intervals no figures/*.csv holds: {missing}"


def test_the_gap_share_table_is_the_criteria_table():
    text = README.read_text()
    start = text.index("| cost model | bs | CNN/DM | GSM8K | InstructCoder | ShareGPT |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    names = {"authors' H100 (linear)": "authors_h100_llama8b", "our H200 fit (linear)": "h200_llama8b",
             "H200 engine (price of K)": "h200_replay_engine"}
    crit = pd.read_csv(FIGURES / "07_online_policy__criteria.csv").set_index(["cost_model", "dataset", "batch_size"])
    cm = None
    for r in rows:
        cm = names[r[0]] if r[0] else cm
        for ds, v in zip(("cnn_dailymail", "gsm8k", "instructcoder", "sharegpt"), r[2:]):
            assert float(v) == pytest.approx(crit.loc[(cm, ds, int(r[1])), "gap_share"], abs=0.005 + 1e-9), (cm, ds, r[1])
    assert len(rows) == 6
