"""The documentation's numbers are the committed figures' tables, not typed-in values. Over README.md and
docs/*.md (prose: fenced code blocks and `code spans` are not read):

- every quoted interval "value [lo, hi]" is a row of some figures/*.csv (a column and its ``_lo``/``_hi``);
- every plain range ("0.93-1.04x", "1.005-1.039x", "17-40%", "-9 to +2%") has both ends, at the precision
  quoted, among the values of one column of one figures/*.csv (so the range is the min and max of some of
  that column's values: the rows a sentence talks about), or tests/numbers_not_from_figures.yaml says where
  it comes from instead (a cited paper's number, a setting, a count, a benchmark's printed output, or a
  claim to re-derive); the column is one of a CSV that the range's paragraph names (else its section; a
  notebook's heading names all of that notebook's CSVs), and not a setting, a count or an interval's end;
  an entry there that no longer covers a range is an error too, and so is a "to re-check" entry whose
  range has come to match (unless it says it matches only by chance);
- the online policy's gap-share table is figures/07_online_policy__criteria.csv rounded.

``python tests/test_readme_numbers.py`` lists every range with the column it matched or the entry that
covers it, then the counts.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pytest
import yaml

if __name__ == "__main__":  # run as a script from anywhere: import sdlib from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdlib.paths import REPO_ROOT

FIGURES = REPO_ROOT / "figures"
ALLOWLIST = Path(__file__).with_name("numbers_not_from_figures.yaml")


def doc_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _rel(path: Path) -> str:
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:  # a page outside the checkout (the tests' own examples)
        return path.name


# ------------------------------------------------------------------------------------------------ prose

@dataclass(frozen=True)
class Prose:
    """A page's prose with whitespace runs collapsed to one space (a quote may break across lines); for each
    character the source line (1-based), the paragraph (a block between blank lines, or one list item) and
    the section (the text under one heading) it belongs to; the spans of its `code`; and each paragraph's
    and section's references to figures (``figures/...`` names and globs, as written)."""

    file: str
    text: str
    lines: tuple
    paras: tuple
    sections: tuple
    code: tuple
    para_refs: tuple  # para_refs[i]: the figure references written in paragraph i
    section_refs: tuple  # section_refs[j]: those in section j, its heading and every heading above it

    def line_of(self, pos: int) -> int:
        return self.lines[min(pos, len(self.lines) - 1)]

    def in_code(self, start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in self.code)


#: "figures/06_trace_replay__hook_control.*", "figures/07_online_policy__measured_h200*", "figures/08_serving__*"
FIGURE_REF = re.compile(r"figures/[\w=.*,\-]+")
#: a heading naming a notebook ("## 06_trace_replay"): its section reads that notebook's figures
NOTEBOOK_HEADING = re.compile(r"#+ (\d\d_[a-z_]+)\b")


@lru_cache(maxsize=None)
def prose(path: Path) -> Prose:
    words = []  # (word, line, paragraph, section)
    para_refs: list[set] = [set()]
    section_refs: list[set] = [set()]
    headings: list[tuple[int, str]] = []  # the chain of headings above the current line: (level, text)
    fenced, para, section, blank = False, 0, 0, True
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        s = line.strip()
        heading = re.match(r"(#+) ", s)
        if not s or heading or re.match(r"([-*]|\d+\.) ", s) or blank:
            para += 1
            para_refs.append(set())
        blank = not s
        if heading:
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level] + [(level, s)]
            section += 1
            section_refs.append(set())
            for _, h in headings:
                section_refs[section] |= set(FIGURE_REF.findall(h))
                nb = NOTEBOOK_HEADING.match(h)
                if nb:
                    section_refs[section].add(f"figures/{nb.group(1)}*")
        refs = set(FIGURE_REF.findall(s))
        para_refs[para] |= refs
        section_refs[section] |= refs
        words += [(w, n, para, section) for w in s.split()]
    text, lines, paras, sections = "", [], [], []
    for w, n, pa, se in words:
        if text:
            text += " "
            lines.append(n)
            paras.append(pa)
            sections.append(se)
        text += w
        lines += [n] * len(w)
        paras += [pa] * len(w)
        sections += [se] * len(w)
    code = tuple((m.start(), m.end()) for m in re.finditer(r"`[^`]*`", text))
    return Prose(_rel(path), text, tuple(lines), tuple(paras), tuple(sections), code,
                 tuple(frozenset(r) for r in para_refs), tuple(frozenset(r) for r in section_refs))


def figure_csvs(refs) -> list[str]:
    """The figures/*.csv names that references such as "figures/x__*.csv", "figures/y.*" or "figures/z.png"
    name (a figure's CSV is its PNG's name with .csv)."""
    names = sorted(f.name for f in FIGURES.glob("*.csv"))
    out = set()
    for ref in refs:
        pat = ref[len("figures/"):].rstrip(".,")
        pats = {pat, re.sub(r"\.(png|svg|\*)$", ".csv", pat), pat + ".csv"}
        out |= {n for n in names if any(fnmatch.fnmatchcase(n, q) for q in pats)}
    return sorted(out)


# ------------------------------------------------------------------------------------------ intervals

#: "1.032x [1.013, 1.051]" or "0.93 [0.87, 0.99]"
TRIPLE = re.compile(r"(-?\d+\.\d+)x? \[(-?\d+\.\d+), (-?\d+\.\d+)\]")


@lru_cache(maxsize=None)
def _triples_in_figures() -> dict[int, frozenset]:
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
    return {d: frozenset(s) for d, s in out.items()}


def quoted_intervals() -> list[tuple[str, int, tuple]]:
    """(file, line, (value, lo, hi) as quoted) for every interval in the docs' prose."""
    out = []
    for f in doc_files():
        p = prose(f)
        out += [(p.file, p.line_of(m.start()), m.groups()) for m in TRIPLE.finditer(p.text)]
    return out


def test_every_quoted_interval_is_a_row_of_a_figure_table():
    quotes = quoted_intervals()
    assert len(quotes) >= 5
    have = _triples_in_figures()
    missing = []
    for file, line, q in quotes:
        d = len(q[0].split(".")[1])
        if tuple(round(float(x), d) for x in q) not in have.get(d, frozenset()):
            missing.append(f"{file}:{line}: {q[0]} [{q[1]}, {q[2]}]")
    assert not missing, "quoted intervals no figures/*.csv holds:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------------------ plain ranges

_NUM = r"\d+(?:\.\d+)?"
#: "0.93-1.04x", "17-40%", "8-20 ms", "1-3%": two unsigned numbers joined by a hyphen (or en dash). Not part
#: of a name ("Llama-3.1-8B", "run2_shares_25-15-30-30"): nothing word-like, '.', '-', '/', '#' right before,
#: no letter, digit or further "-number" right after.
HYPHEN_RANGE = re.compile(rf"(?<![\w.\-/#=+])({_NUM})(x|%)?[-\u2013]({_NUM})(x|%)?(?![\w.]*\d|[A-Za-z_]|[-\u2013]\d)")
#: "-9 to +2%", "-16 to -1%": signed ends joined by "to"; the unit after the second end is required (so that
#: "from 0.20 to 0.95" is not read as a range).
TO_RANGE = re.compile(rf"(?<![\w.])([+-]?{_NUM})(x|%)? to ([+-]?{_NUM})(x|%)(?![\w])")
_UNIT_AFTER = re.compile(r" ?(ms|s)\b")

#: Columns that hold settings or identifiers (batch sizes, k, rates, percentiles asked for, prompt ids) and
#: counts of rows, not measured quantities: a range is never matched against them.
SETTING_COLUMNS = re.compile(r"(batch_size|ref_batch_size|k|K|num_spec_tokens|synthetic_L|rate_rps|percentile|"
                             r"price_per_server_hour|request|request_id|pos|bin|batch_index|split_at|repeats|runs|"
                             r"server|servers|cells|seed|n|n_.*|num_.*)")


@dataclass(frozen=True)
class Range:
    file: str
    line: int
    start: int
    end: int
    lo: str
    hi: str
    unit: str  # "x", "%", "ms", "s" or ""
    context: str  # the words around it, for messages
    scope: tuple  # the figures/*.csv it is read against (see ``scope``)

    @property
    def text(self) -> str:
        return f"{self.lo}-{self.hi}{self.unit if self.unit in ('x', '%') else (' ' + self.unit if self.unit else '')}"


def scope(p: Prose, pos: int) -> list[str]:
    """The tables a number at ``pos`` is read against: the figure CSVs its paragraph names; where it names
    none (or only figures without a CSV), those its section (with the headings above it) names, a notebook's
    heading ("## 06_trace_replay") naming all of that notebook's.
    Empty where neither names one: such a number has to say where it comes from (the allow-list)."""
    return figure_csvs(p.para_refs[p.paras[pos]]) or figure_csvs(p.section_refs[p.sections[pos]])


def plain_ranges() -> list[Range]:
    """Every plain range in the docs' prose (not in `code`), in file order."""
    out = []
    for f in doc_files():
        p = prose(f)
        found = []
        for rx in (HYPHEN_RANGE, TO_RANGE):
            for m in rx.finditer(p.text):
                if p.in_code(m.start(), m.end()):
                    continue
                unit = m.group(4) or m.group(2) or ""
                tail = _UNIT_AFTER.match(p.text, m.end())
                if not unit and tail:
                    unit = tail.group(1)
                ctx = p.text[max(0, m.start() - 60):m.end() + 40]
                found.append(Range(p.file, p.line_of(m.start()), m.start(), m.end(), m.group(1).lstrip("+"),
                                   m.group(3).lstrip("+"), unit, ctx, tuple(scope(p, m.start()))))
        out += sorted(found, key=lambda r: r.start)
    return out


@lru_cache(maxsize=None)
def _columns(csv: str) -> tuple[tuple[str, np.ndarray], ...]:
    """(column, finite values) for every numeric column of one figures/*.csv that holds a measured quantity
    (not a setting, an identifier or a count, and not an interval's end or a spread)."""
    df = pd.read_csv(FIGURES / csv)
    out = []
    for c in df.columns:
        c = str(c)
        if SETTING_COLUMNS.fullmatch(c) or re.search(r"_(lo|hi|std)$|_(lo|hi)_|^(lo|hi)_|_q\d+$", c):
            continue
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        v = np.unique(v[np.isfinite(v)])
        if len(v):
            out.append((c, v))
    return tuple(out)


def _decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def _near(values: np.ndarray, quoted: str) -> bool:
    """Some value equals ``quoted`` at its precision (rounded half either way)."""
    q = float(quoted)
    return bool(np.any(np.abs(values - q) <= 0.5 * 10.0 ** -_decimals(quoted) * (1 + 1e-9) + 1e-12))


def _scales(unit: str, column: str) -> tuple[float, ...]:
    """How a column's values are written in the prose: a share (0.17) as a percentage ("17%"); a time in
    ms from a column in ms (``*_ms``), or x1000 from one in seconds (``*_s``); anything else as it is."""
    if unit == "%":
        return (100.0,)
    if unit == "ms":
        return (1.0,) if re.search(r"(^|_)ms($|_)", column) else (1000.0,) if re.search(r"(^|_)s$", column) else ()
    if unit == "s":
        return (1.0,) if re.search(r"(^|_)s$", column) else ()
    return (1.0,)


def matching_columns(r: Range) -> list[str]:
    """Every "file.csv:column" of the range's scope holding both ends (at the quoted precision)."""
    if float(r.lo) > float(r.hi):
        return []
    return [f"{csv}:{name}" + (f" x{s:g}" if s != 1 else "")
            for csv in r.scope for name, values in _columns(csv) for s in _scales(r.unit, name)
            if _near(values * s, r.lo) and _near(values * s, r.hi)]


# ------------------------------------------------------------------------------------------ the allow-list

@lru_cache(maxsize=None)
def allowlist() -> dict:
    """The entries of tests/numbers_not_from_figures.yaml: ``patterns`` (a regex over the prose that marks a
    range as a setting wherever it appears) and ``ranges`` (a quote in one file)."""
    data = yaml.safe_load(ALLOWLIST.read_text())
    for e in data.get("patterns", []) + data.get("ranges", []):
        assert e.get("category") in CATEGORIES, f"{ALLOWLIST.name}: category of {e} not one of {sorted(CATEGORIES)}"
        assert e.get("source"), f"{ALLOWLIST.name}: {e} says not where the number comes from"
    return data


#: Why a number is not from our figures.
CATEGORIES = {
    "cited": "another source's number (the paper, other SD papers, the paper's figure numbers)",
    "setting": "a config or benchmark setting (batch sizes, request rates, message sizes), not a measurement",
    "benchmark": "a benchmark's printed output quoted on the same page (make bench-serving), not a figure",
    "measured elsewhere": "measured once outside the sweeps (timings of an import), no figure holds it",
    "to re-check": "a claim no figure CSV holds yet; issue 21 (measurements) re-derives it. With "
                   "``matches_by_chance`` (what the rows hold): its ends occur in a column, but not in the "
                   "rows the sentence talks about",
}


def covering_entry(r: Range) -> Optional[dict]:
    """The allow-list entry that covers ``r``: a pattern matching around it, or a quote in its file that
    contains it."""
    p = next(prose(f) for f in doc_files() if _rel(f) == r.file)
    for e in allowlist().get("patterns", []):
        for m in re.finditer(e["regex"], p.text):
            if m.start() <= r.start and r.end <= m.end():
                return e
    for e in allowlist().get("ranges", []):
        if e["file"] != r.file:
            continue
        q = " ".join(e["quote"].split())
        for m in re.finditer(re.escape(q), p.text):
            if m.start() <= r.start and r.end <= m.end():
                return e
    return None


def group_of(r: Range, match: str) -> Optional[str]:
    """A set of rows of the matched table whose min and max are exactly the range's ends: the rows where up to
    three key columns (text, settings) take one value each, e.g. "batch_size=128, replay=combine". None where
    the ends only occur in the column (for ``python tests/test_readme_numbers.py``, not a test: a sentence
    may talk about rows no such filter picks)."""
    import itertools

    csv, rest = match.split(":", 1)
    col, _, s = rest.partition(" x")
    df = pd.read_csv(FIGURES / csv)
    scale = float(s) if s else 1.0
    v = pd.to_numeric(df[col], errors="coerce") * scale
    keys = [c for c in df.columns if c != col and (SETTING_COLUMNS.fullmatch(str(c)) or not pd.api.types.is_numeric_dtype(df[c]))]
    for n in range(0, 4):
        for ks in itertools.combinations(keys, n):
            by = list(ks) if n > 1 else ks[0] if ks else None
            groups = [((), df.index)] if by is None else list(df.groupby(by, dropna=False).groups.items())
            for g, idx in groups:
                x = v.loc[idx].dropna().to_numpy()
                if len(x) and _near(np.array([x.min()]), r.lo) and _near(np.array([x.max()]), r.hi):
                    g = g if isinstance(g, tuple) else (g,)
                    return ", ".join(f"{k}={val}" for k, val in zip(ks, g)) or "all rows"
    return None


def classify() -> list[tuple[Range, list[str], Optional[dict]]]:
    """(range, the columns it matches, covering entry or None) for every plain range."""
    return [(r, matching_columns(r), covering_entry(r)) for r in plain_ranges()]


def test_every_plain_range_is_a_figure_column_or_says_where_it_comes_from():
    rows = classify()
    assert len(rows) >= 20
    bad = [r for r, cols, e in rows if not cols and e is None]
    assert not bad, ("plain ranges that match no figures/*.csv column and are not in "
                     f"{ALLOWLIST.name} (re-derive them, or add an entry saying where they come from):\n"
                     + "\n".join(f"{r.file}:{r.line}: {r.text}   ...{r.context}..." for r in bad))


def test_a_range_to_recheck_that_now_matches_a_figure_leaves_the_allowlist():
    stale = [(r, col) for r, col, e in classify()
             if col and e and e["category"] == "to re-check" and not e.get("matches_by_chance")]
    assert not stale, "these now match a figure CSV; remove their 'to re-check' entries:\n" + "\n".join(
        f"{r.file}:{r.line}: {r.text} ({'; '.join(col)})" for r, col in stale)


def test_every_allowlist_entry_covers_a_range_on_its_page():
    ranges = plain_ranges()
    used = {id(e) for e in (covering_entry(r) for r in ranges) if e is not None}
    unused = [e for e in allowlist().get("patterns", []) + allowlist().get("ranges", []) if id(e) not in used]
    assert not unused, f"{ALLOWLIST.name} entries that cover no range any more (remove them): {unused}"


def test_the_range_reader_reads_ranges_and_leaves_names_alone():
    text = ("runs at 0.93-1.04x of k = 3 and 1.005-1.039x at bs 128; closes 17-40% and -9 to +2%; "
            "Llama-3.1-8B, EAGLE-3, 9.4M-parameter, x86_64, from 0.20 to 0.95 and 1.3-2 ms")
    got = [(m.group(1), m.group(3)) for rx in (HYPHEN_RANGE, TO_RANGE) for m in rx.finditer(text)]
    assert sorted(got) == sorted([("0.93", "1.04"), ("1.005", "1.039"), ("17", "40"), ("-9", "+2"), ("1.3", "2")])
    values = np.array([0.9349, 1.0351, 7.0])
    assert _near(values, "0.93") and _near(values, "1.04") and not _near(values, "1.03")


def test_a_range_is_read_against_the_tables_its_paragraph_or_section_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "## 06_trace_replay\n\n"
        "Own host time 0.02-0.31 ms per step.\n\n"  # the section's notebook: its CSVs
        "Named: 0.02-0.31 ms (`figures/06_trace_replay__hook_control.*`).\n\n"
        "Made up: 0.02-9.99 ms per step (`figures/06_trace_replay__hook_control.csv`).\n\n"
        "Wrong table named: 0.02-0.31 ms (`figures/07_online_policy__criteria.csv`).\n\n"
        "## Elsewhere\n\nNo table named: 0.02-0.31 ms, and `0.02-9.99` in code is not read.\n")
    globals()["doc_files"], saved = (lambda: [page]), doc_files
    try:
        got = [(r.line, bool(cols), e) for r, cols, e in classify()]
    finally:
        globals()["doc_files"] = saved
    assert got == [(3, True, None), (5, True, None), (7, False, None), (9, False, None), (13, False, None)]


# ------------------------------------------------------------------------------------------ gap shares

GAP_TABLE = "| cost model | bs | CNN/DM | GSM8K | InstructCoder | ShareGPT |"


def test_the_gap_share_table_is_the_criteria_table():
    pages = [f for f in doc_files() if GAP_TABLE in f.read_text()]
    assert len(pages) == 1, pages
    text = pages[0].read_text()
    start = text.index(GAP_TABLE)
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


if __name__ == "__main__":
    rows = classify()
    counts: dict[str, int] = {}
    exact = 0
    for r, cols, e in rows:
        if e:
            how = f"[{e['category']}] {e['source']}" + (f" (matches by chance: {e['matches_by_chance']})"
                                                         if e.get("matches_by_chance") else "")
            key = e["category"] + (" (matches a column by chance)" if e.get("matches_by_chance") else "")
        elif cols:
            groups = [(c, group_of(r, c)) for c in cols]
            exact += any(g for _, g in groups)
            how = "; ".join(f"{c} [{'min-max of rows: ' + g if g else 'ends only'}]" for c, g in groups)
            key = "checked against a figure"
        else:
            how = key = "UNMATCHED"
        counts[key] = counts.get(key, 0) + 1
        print(f"{r.file}:{r.line}: {r.text:<16} {how}")
    print(f"\n{len(rows)} plain ranges, {len(quoted_intervals())} quoted intervals")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {v:4d}  {k}")
    print(f"  of those checked, {exact} are exactly the min and max of a set of rows picked by up to three key columns")
