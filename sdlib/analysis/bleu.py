"""BLEU-4 of a request's prompt vs its output: how much the output copies the prompt (n-gram's best case).

Direction: the prompt is the *reference*, the output the *hypothesis*. BLEU's
clipped n-gram precisions then measure the share of the output's n-grams found
in the prompt -- what prompt-lookup (n-gram) drafting can exploit -- and the
brevity penalty applies when the output is shorter than the prompt. (The paper
says "prompt/output BLEU-4" without the direction; this is the one that
measures copying from the prompt.)

Score: nltk ``sentence_bleu`` with uniform 4-gram weights (0.25 each) and
``SmoothingFunction().method1`` (an n-gram order with no match counts
``epsilon = 0.1`` matches instead of 0, i.e. sacrebleu's ``smooth_method='floor',
smooth_value=0.1``), in [0, 1]. Units: token ids as strings when there is no
tokenizer (the reference traces), whitespace-separated words of the decoded text
otherwise. For Llama-3 chat prompts, :func:`llama3_user_content` keeps only the
user message (no system header, no special tokens).

Usage:
    from sdlib.analysis.bleu import bin_counts, bleu_bins, prompt_output_bleu
    b = prompt_output_bleu(load_reference_traces(["instructcoder"]))   # dataset, request_id, bleu4, ...
    b["bin"] = bleu_bins(b.bleu4)                                       # "0.0-0.2" ... "0.8-1.0"
    bin_counts(b)                                                       # requests per dataset and bin
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from sdlib.core import bootstrap
from sdlib.core.registry import PolicyRef

WEIGHTS = (0.25, 0.25, 0.25, 0.25)
SMOOTHING = "method1"
#: Llama-3 special token ids start here (<|begin_of_text|> = 128000)
LLAMA3_SPECIAL_MIN = 128000
_LLAMA3_USER_HEADER = (128006, 882, 128007)  # <|start_header_id|>user<|end_header_id|>
_LLAMA3_EOT = 128009
_LLAMA3_NL2 = 271  # "\n\n" after a header


def _units(x: Any, tokenizer: Any = None) -> list[str]:
    """Token units for BLEU: text -> whitespace words; ids -> decoded words (tokenizer) or ids as strings."""
    if isinstance(x, str):
        return x.split()
    if tokenizer is not None:
        return tokenizer.decode(list(map(int, x))).split()
    return [str(int(t)) for t in x]


def bleu4(reference: Any, hypothesis: Any, tokenizer: Any = None, smoothing: Optional[str] = SMOOTHING) -> float:
    """Sentence BLEU-4 of ``hypothesis`` against one ``reference`` (text or token ids), in [0, 1].

    ``smoothing``: a ``SmoothingFunction`` method name (default ``method1``: zero
    n-gram matches count 0.1), or None for none (any order without a match -> 0).
    """
    ref, hyp = _units(reference, tokenizer), _units(hypothesis, tokenizer)
    if not hyp or not ref:
        return 0.0
    sf = getattr(SmoothingFunction(), smoothing) if smoothing else SmoothingFunction().method0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nltk warns on zero counts without smoothing
        return float(sentence_bleu([ref], hyp, weights=WEIGHTS, smoothing_function=sf))


def llama3_user_content(ids: Sequence[int]) -> list[int]:
    """The user message of a Llama-3 chat prompt: after the last user header (and its "\\n\\n"), up to <|eot_id|>.

    Without a user header: the ids with special tokens (>= 128000) dropped.
    """
    ids = list(map(int, ids))
    h = len(_LLAMA3_USER_HEADER)
    start = None
    for i in range(len(ids) - h, -1, -1):
        if tuple(ids[i:i + h]) == _LLAMA3_USER_HEADER:
            start = i + h
            break
    if start is None:
        return [t for t in ids if t < LLAMA3_SPECIAL_MIN]
    if start < len(ids) and ids[start] == _LLAMA3_NL2:
        start += 1
    end = ids.index(_LLAMA3_EOT, start) if _LLAMA3_EOT in ids[start:] else len(ids)
    return [t for t in ids[start:end] if t < LLAMA3_SPECIAL_MIN]


def strip_special(ids: Sequence[int]) -> list[int]:
    """Drop Llama-3 special tokens (e.g. the output's trailing <|eot_id|>)."""
    return [int(t) for t in ids if int(t) < LLAMA3_SPECIAL_MIN]


def prompt_output_bleu(traces: pd.DataFrame, tokenizer: Any = None, llama3_template: bool = True) -> pd.DataFrame:
    """BLEU-4 (reference = prompt, hypothesis = output) per request of long-form traces.

    ``llama3_template``: keep only the user message of the prompt and drop special
    tokens from the output (the reference traces are Llama-3 chat prompts).
    Returns one row per (dataset, request_id): bleu4, prompt_tokens, output_tokens
    (as compared).
    """
    first = traces.drop_duplicates(["dataset", "request_id"])
    rows = []
    for r in first.itertuples(index=False):
        p = llama3_user_content(r.prompt_token_ids) if llama3_template else list(r.prompt_token_ids)
        o = strip_special(r.output_token_ids) if llama3_template else list(r.output_token_ids)
        rows.append({"dataset": r.dataset, "request_id": str(r.request_id), "bleu4": bleu4(p, o, tokenizer),
                     "prompt_tokens": len(p), "output_tokens": len(o)})
    return pd.DataFrame(rows)


def bleu_bins(values, width: float = 0.2) -> pd.Categorical:
    """Bin labels ``"0.0-0.2"``, ..., ``"0.8-1.0"`` (left-closed; 1.0 goes in the last bin), ordered."""
    n = int(round(1.0 / width))
    edges = np.round(np.linspace(0.0, 1.0, n + 1), 10)
    labels = [f"{edges[i]:.1f}-{edges[i + 1]:.1f}" if width >= 0.1 else f"{edges[i]:.2f}-{edges[i + 1]:.2f}"
              for i in range(n)]
    v = np.clip(np.asarray(values, dtype=float), 0.0, 1.0)
    idx = np.minimum(np.floor(v / width + 1e-9).astype(int), n - 1)
    return pd.Categorical.from_codes(idx, categories=labels, ordered=True)


#: Bins with fewer requests than this are drawn pale and left out of the prose.
MIN_BIN_REQUESTS = 5


def binned_relative_speedup(per_request: pd.DataFrame, bleu: pd.DataFrame, reference_label: str,
                            label_col: str = "label", width: float = 0.2, n_boot: int = bootstrap.N_BOOT,
                            level: float = bootstrap.LEVEL) -> pd.DataFrame:
    """Per BLEU bin: mean throughput of each label / mean throughput of ``reference_label`` - 1, over the
    bin's requests that have both (paired), with a bootstrap interval over those requests.

    ``per_request``: dataset, request_id, ``label_col``, sd_tok_per_s (one row per request and label,
    e.g. from :func:`sdlib.sim.oracle.simulate_requests`); ``bleu``: dataset, request_id, bleu4.
    Returns dataset, bin, label, num_requests, tok_per_s, ref_tok_per_s, relative_speedup (0.5 = +50%),
    relative_speedup_lo, relative_speedup_hi (``level`` percentile interval of ``n_boot`` paired
    resamples of the bin's requests; NaN with fewer than 2 requests).
    """
    d = per_request.merge(bleu[["dataset", "request_id", "bleu4"]], on=["dataset", "request_id"])
    d["bin"] = bleu_bins(d["bleu4"], width)
    ref = d[d[label_col] == reference_label][["dataset", "request_id", "sd_tok_per_s"]].rename(
        columns={"sd_tok_per_s": "ref_tok_per_s"}).drop_duplicates(["dataset", "request_id"])
    pair = d[d[label_col] != reference_label].merge(ref, on=["dataset", "request_id"])
    cols = ["dataset", "bin", "label", "num_requests", "tok_per_s", "ref_tok_per_s", "relative_speedup",
            "relative_speedup_lo", "relative_speedup_hi"]
    rows = []
    for (ds, b, lab), g in pair.groupby(["dataset", "bin", label_col], observed=True):
        x, r = g["sd_tok_per_s"].to_numpy(float), g["ref_tok_per_s"].to_numpy(float)
        lo, hi = bootstrap.paired_ratio_interval(x, r, bootstrap.rng("bleu", ds, str(b), lab), n_boot, level)
        rows.append({"dataset": ds, "bin": b, "label": lab, "num_requests": len(g), "tok_per_s": x.mean(),
                     "ref_tok_per_s": r.mean(), "relative_speedup": x.mean() / r.mean() - 1.0,
                     "relative_speedup_lo": lo - 1.0, "relative_speedup_hi": hi - 1.0})
    out = pd.DataFrame(rows, columns=cols)
    out["bin"] = pd.Categorical(out["bin"], categories=bleu_bins([0.0], width).categories, ordered=True)
    return out


def bin_counts(bleu: pd.DataFrame, width: float = 0.2) -> pd.DataFrame:
    """Requests per (dataset, BLEU-4 bin), every bin listed (0 where empty): dataset, bin, num_requests."""
    b = bleu.assign(bin=bleu_bins(bleu["bleu4"], width))
    return b.groupby(["dataset", "bin"], observed=False).size().rename("num_requests").reset_index()


def sim_labels(eagle_k: int, ngram_ks: Sequence[int]) -> dict[PolicyRef, str]:
    """Legend label per simulated policy (fixed k): EAGLE-3 with ``eagle_k`` first (the reference), then
    n-gram with each of ``ngram_ks``."""
    return {PolicyRef("fixed", "eagle3", int(eagle_k)): f"EAGLE-3 k={eagle_k}",
            **{PolicyRef("fixed", "ngram", int(k)): f"n-gram k={k}" for k in ngram_ks}}


def binned_by_convention(per_request: pd.DataFrame, bleu: pd.DataFrame, labels: dict[PolicyRef, str],
                         reference_label: str, width: float = 0.2) -> pd.DataFrame:
    """:func:`binned_relative_speedup` of simulated requests, per convention.

    ``per_request``: :func:`sdlib.sim.oracle.simulate_requests` rows; each policy in ``labels`` gets its
    label, the others are dropped. Adds a ``convention`` column.
    """
    per = per_request.copy()
    per["label"] = per["policy"].map({ref.label: lab for ref, lab in labels.items()})
    per = per[per.label.notna()]
    return pd.concat([binned_relative_speedup(g, bleu, reference_label, width=width).assign(convention=c)
                      for c, g in per.groupby("convention")], ignore_index=True)


def _method_of(m: pd.DataFrame) -> pd.Series:
    """The SD method of each measured row (its ``method`` column; never read back from the label)."""
    return m["method"].astype(str)


def measured_relative_speedup(measured: pd.DataFrame, width: float = 0.2, bleu_col: str = "bleu4",
                              reference_method: str = "eagle3", compared_method: str = "ngram",
                              n_boot: int = 2000) -> tuple[pd.DataFrame, Optional[str], int]:
    """Per dataset and BLEU bin, measured throughput of each ``compared_method`` label (n-gram, every k)
    relative to the dataset's ``reference_method`` label (EAGLE-3), at the smallest batch size, paired by
    request (prompt), with bootstrap intervals (:func:`binned_relative_speedup`).

    ``measured``: :func:`measured_bleu_runs` rows; ``bleu_col``: ``bleu4`` or ``bleu4_no_bp``. Returns
    (rows with ``pale`` = fewer than :data:`MIN_BIN_REQUESTS` requests; empty without a reference; the
    reference label (several joined by " / " when datasets differ) or None; the batch size).
    """
    if measured.empty:
        return pd.DataFrame(), None, 0
    bs = int(measured.batch_size.min())
    m = measured[measured.batch_size == bs].assign(_method=lambda x: _method_of(x))
    frames, refs = [], []
    for ds, g in m.groupby("dataset"):
        ref = next(iter(sorted(g.loc[g._method == reference_method, "label"].unique())), None)
        if ref is None or not (g._method == compared_method).any():
            continue
        refs.append(ref)
        g = g[(g._method == compared_method) | (g.label == ref)]
        bleu = g[["dataset", "request_id", bleu_col]].drop_duplicates(["dataset", "request_id"]).rename(
            columns={bleu_col: "bleu4"})
        frames.append(binned_relative_speedup(g.drop(columns=[c for c in ("bleu4",) if c in g.columns]), bleu, ref,
                                              width=width, n_boot=n_boot).assign(reference=ref))
    if not frames:
        return pd.DataFrame(), None, bs
    out = pd.concat(frames, ignore_index=True)
    out["pale"] = out["num_requests"] < MIN_BIN_REQUESTS
    return out, " / ".join(dict.fromkeys(refs)), bs


def bin_sentences(b: pd.DataFrame, ref_label: str, min_requests: int = MIN_BIN_REQUESTS) -> list[str]:
    """Prose for per-bin relative speedups (:func:`binned_relative_speedup` rows, one convention): per
    dataset and label, the bins whose interval lies above 0 (faster than ``ref_label``), below 0 (slower),
    and the rest (not established); bins with fewer than ``min_requests`` requests are left out and counted."""
    out = []
    for (ds, lab), g in b.groupby(["dataset", "label"], observed=True):
        g = g.sort_values("bin")
        ok = g[g["num_requests"] >= min_requests]
        few = int((g["num_requests"] < min_requests).sum())

        def fmt(r) -> str:
            return f"{r.bin} ({100 * r.relative_speedup:+.0f}% [{100 * r.relative_speedup_lo:+.0f}, " \
                   f"{100 * r.relative_speedup_hi:+.0f}], n={r.num_requests})"
        faster = [fmt(r) for r in ok.itertuples() if r.relative_speedup_lo > 0]
        slower = [fmt(r) for r in ok.itertuples() if r.relative_speedup_hi < 0]
        unsure = [str(r.bin) for r in ok.itertuples() if not (r.relative_speedup_lo > 0 or r.relative_speedup_hi < 0)]
        parts = [f"faster than {ref_label} in " + "; ".join(faster)] if faster else []
        parts += [f"slower than {ref_label} in " + "; ".join(slower)] if slower else []
        parts += [f"not established in {', '.join(unsure)} (interval includes 0)"] if unsure else []
        tail = f" ({few} bin(s) with fewer than {min_requests} requests left out)" if few else ""
        out.append(f"{ds}, {lab}: " + (". ".join(parts) or "no bin with enough requests") + "." + tail)
    return out


def brevity_penalty(reference_len, hypothesis_len) -> np.ndarray:
    """BLEU's brevity penalty per pair: 1 when the hypothesis (output) is at least as long as the
    reference (prompt), else ``exp(1 - r / c)`` (``c`` counted as at least 1)."""
    r = np.asarray(reference_len)
    c = np.asarray(hypothesis_len)
    return np.where(c < r, np.exp(1 - r / np.maximum(c, 1)), 1.0)


def without_brevity_penalty(bleu: pd.DataFrame, width: float = 0.2) -> pd.DataFrame:
    """``bleu`` (:func:`prompt_output_bleu` rows) plus ``bleu4_no_bp`` = BLEU-4 / brevity penalty (at
    most 1) and its ``bin``. For outputs cut far shorter than their prompts, where the penalty alone
    would put every request in the lowest bin."""
    out = bleu.copy()
    bp = brevity_penalty(out["prompt_tokens"], out["output_tokens"])
    out["bleu4_no_bp"] = (out["bleu4"] / bp).clip(upper=1.0)
    out["bin"] = bleu_bins(out["bleu4_no_bp"], width)
    return out


def acceptance_per_request(gains: pd.DataFrame, bleu: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, method, request): mean tokens gained per verify step (``acc_len``) beside the
    request's BLEU-4 columns (``bleu``: :func:`without_brevity_penalty` rows; ``gains``:
    :func:`sdlib.analysis.variance.trace_gains`)."""
    per = gains.groupby(["dataset", "method", "request_id"]).gained.mean().rename("acc_len").reset_index()
    return per.merge(bleu[["dataset", "request_id", "bleu4", "bleu4_no_bp", "bin"]], on=["dataset", "request_id"])


def acceptance_bins(per_request: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, BLEU bin, method): mean of the requests' ``acc_len`` and how many requests."""
    return (per_request.groupby(["dataset", "bin", "method"], observed=True)
            .agg(acc_len=("acc_len", "mean"), num_requests=("request_id", "nunique")).reset_index())


def _not_meaningful(sweep_dir: Path) -> str:
    """Why a sweep's acceptance cannot be related to BLEU ('' if it can): synthetic or random."""

    p = Path(sweep_dir) / "provenance.json"
    if not p.exists():
        return ""
    prov = json.loads(p.read_text())
    if any("synthetic" in json.dumps(m.get("options", {})) for m in prov.get("config", {}).get("methods", [])):
        return "synthetic acceptance (does not depend on prompt/output overlap)"
    cards = [c for inv in prov.get("invocations", []) for c in inv.get("models", {}).values()]
    if any(c.get("random_weights") for c in cards):
        return "random-weight models (acceptance is not about overlap)"
    return ""


def measured_bleu_runs(sweep_dirs, prompt_ids: Optional[Callable[[pd.DataFrame], pd.Series]] = None,
                       methods: Sequence[str] = ("ngram", "eagle", "eagle3")) -> tuple[pd.DataFrame, str]:
    """Measured per-request throughput with BLEU-4, from sweep folders that ran n-gram and EAGLE.

    ``sweep_dirs``: sweep folders (``sdlib.store.sweep_store`` layout) with ``runs`` and ``requests``
    tables whose requests carry ``output_token_ids``. BLEU needs the prompt's token ids: a
    ``prompt_token_ids`` column in ``requests`` or ``prompt_ids(requests)`` returning them. Sweeps whose
    acceptance does not depend on the text (synthetic acceptance, random weights) are skipped.
    Returns (rows: sweep, dataset, request_id (prompt index), label, method, batch_size, sd_tok_per_s
    (output tokens / latency), prompt_tokens, output_tokens, bleu4, bleu4_no_bp ; a sentence saying what
    was found or why nothing).
    """
    # deferred: sdlib.store loads pandas, and only this path needs it
    from sdlib.store import read_table

    cols = ["sweep", "dataset", "request_id", "label", "method", "batch_size", "sd_tok_per_s", "prompt_tokens",
            "output_tokens", "bleu4", "bleu4_no_bp"]
    empty = pd.DataFrame(columns=cols)
    sweeps = [Path(p) for p in sweep_dirs if (Path(p) / "requests").is_dir() and (Path(p) / "runs").is_dir()]
    if not sweeps:
        return empty, "no sweep with runs and requests tables"
    frames, why = [], []
    for s in sweeps:
        skip = _not_meaningful(s)
        if skip:
            why.append(f"{s.name}: {skip}")
            continue
        runs, req = read_table(s, "runs"), read_table(s, "requests")
        runs = runs[runs["method"].isin(methods)]
        if runs["method"].nunique() < 2 or not runs["method"].eq("ngram").any():
            why.append(f"{s.name}: no n-gram and EAGLE rows")
            continue
        req = req.merge(runs[["run_id", "method_label", "method", "dataset", "batch_size"]], on="run_id")
        req = req[req["output_token_ids"].notna()]
        if "prompt_token_ids" in req:
            pids = req["prompt_token_ids"]
        elif prompt_ids is not None:
            pids = prompt_ids(req)
        else:
            why.append(f"{s.name}: requests carry no prompt token ids")
            continue

        out_ids = req["output_token_ids"].map(lambda x: json.loads(x) if isinstance(x, str) else list(x))
        pids = pids.map(lambda x: json.loads(x) if isinstance(x, str) else list(x))
        p_ids = [strip_special(p) for p in pids]
        o_ids = [strip_special(o) for o in out_ids]
        b = np.array([bleu4(p, o) for p, o in zip(p_ids, o_ids)])
        pl, ol = np.array([len(p) for p in p_ids]), np.array([len(o) for o in o_ids])
        frames.append(pd.DataFrame({
            "sweep": s.name, "dataset": req["dataset"].astype(str).values,
            "request_id": req["prompt_index"].astype(str).values, "label": req["method_label"].astype(str).values,
            "method": req["method"].astype(str).values, "batch_size": req["batch_size"].astype(int).values,
            "sd_tok_per_s": (req["output_tokens"] / req["latency_s"]).astype(float).values,
            "prompt_tokens": pl, "output_tokens": ol, "bleu4": b,
            "bleu4_no_bp": np.minimum(b / brevity_penalty(pl, ol), 1.0)}))
    if not frames:
        return empty, "; ".join(why)
    return pd.concat(frames, ignore_index=True)[cols], f"{len(frames)} sweep(s) with n-gram and EAGLE requests"
