"""Acceptance traces prepared for the simulator and the replay: one entry per request, both drafters' lists as
arrays, the n-gram look-up's continuation lengths, and the cuts every consumer shares.

Usage:
    from sdlib.sim.prepared import prepare_traces, truncate_traces
    prep = truncate_traces(prepare_traces(load_reference_traces()), max_len=256)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from sdlib.extract.ngram import ngram_lookup_lengths

#: The authors' per-dataset sample (SpecDecode-Bench simulator: ``random.seed(42); random.sample(data, 300)``).
AUTHORS_SAMPLE_SIZE = 300
AUTHORS_SEED = 42


@dataclass
class PreparedTraces:
    """One entry per request (both methods), arrays ready for the simulator."""

    dataset: np.ndarray  # (R,) object
    request_id: np.ndarray  # (R,) object
    prompt_len: np.ndarray  # (R,) int64
    output_len: np.ndarray  # (R,) int64, len(output_token_ids)
    acc: dict  # method -> list of int64 arrays (acc_len per output position)
    ngram_avail: Optional[list]  # per request, ngram_lookup_lengths (None if not computed)
    prompt_token_ids: Optional[list] = None
    output_token_ids: Optional[list] = None
    _flat: dict = field(default_factory=dict, repr=False, compare=False)  # cache: key -> (flat, offsets, lens)

    def flat(self, key: str):
        """(flat values, offsets, lengths) of ``acc[key]`` or of ``ngram_avail`` (key ``"avail"``), cached."""
        if key not in self._flat:
            arrs = self.ngram_avail if key == "avail" else self.acc[key]
            if arrs is None:
                raise ValueError("needs the n-gram lookup: prepare_traces(..., ngram_lookup=True)")
            lens = np.array([len(a) for a in arrs], dtype=np.int64)
            self._flat[key] = (*_flat(arrs, lens), lens)
        return self._flat[key]

    def __len__(self) -> int:
        return len(self.dataset)

    def take(self, idx: Sequence[int]) -> "PreparedTraces":
        idx = list(idx)
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return PreparedTraces(self.dataset[idx], self.request_id[idx], self.prompt_len[idx], self.output_len[idx],
                              {m: pick(v) for m, v in self.acc.items()}, pick(self.ngram_avail),
                              pick(self.prompt_token_ids), pick(self.output_token_ids))


def prepare_traces(traces: pd.DataFrame, ngram_lookup: bool = True, keep_tokens: bool = False) -> PreparedTraces:
    """Long-form traces (one row per request and method) -> :class:`PreparedTraces`.

    Requests must have both ``ngram`` and ``eagle3`` rows. ``ngram_lookup``
    re-runs the n-gram lookup on the token ids (needed by the ``corrected``
    convention for n-gram with fixed k; ~1 s for the reference traces).
    """
    need = {"ngram", "eagle3"}
    wide = {}
    order = []
    for row in traces.itertuples(index=False):
        key = (row.dataset, str(row.request_id))
        if key not in wide:
            wide[key] = {"prompt": row.prompt_token_ids, "output": row.output_token_ids}
            order.append(key)
        wide[key][row.method] = np.asarray(row.acc_len, dtype=np.int64)
    missing = [k for k in order if not need <= set(wide[k])]
    if missing:
        raise ValueError(f"{len(missing)} requests lack one of {sorted(need)}, e.g. {missing[0]}")
    ds = np.array([k[0] for k in order], dtype=object)
    rid = np.array([k[1] for k in order], dtype=object)
    P = np.array([len(wide[k]["prompt"]) for k in order], dtype=np.int64)
    O = np.array([len(wide[k]["output"]) for k in order], dtype=np.int64)
    acc = {m: [wide[k][m] for k in order] for m in sorted(need)}
    avail = [ngram_lookup_lengths(wide[k]["prompt"], wide[k]["output"]) for k in order] if ngram_lookup else None
    toks = ([list(wide[k]["prompt"]) for k in order], [list(wide[k]["output"]) for k in order]) if keep_tokens \
        else (None, None)
    return PreparedTraces(ds, rid, P, O, acc, avail, *toks)


def authors_sample_indices(n: int, k: int = AUTHORS_SAMPLE_SIZE, seed: int = AUTHORS_SEED) -> list[int]:
    """The indices ``random.seed(seed); random.sample(data, k)`` picks from ``n`` rows (all if ``n <= k``)."""
    if n <= k:
        return list(range(n))
    rng = random.Random(seed)
    return rng.sample(range(n), k)


def select_requests(prep: PreparedTraces, sample: Optional[str | int] = None,
                    datasets: Optional[Iterable[str]] = None) -> PreparedTraces:
    """Restrict to ``datasets`` and a per-dataset sample: None (all), ``"authors"`` (their 300 of each), or an int."""
    idx = []
    names = list(dict.fromkeys(prep.dataset)) if datasets is None else list(datasets)
    for d in names:
        rows = np.flatnonzero(prep.dataset == d)
        if sample is None:
            pick = range(len(rows))
        elif sample == "authors":
            pick = authors_sample_indices(len(rows))
        else:
            pick = authors_sample_indices(len(rows), int(sample))
        idx.extend(rows[list(pick)].tolist())
    return prep.take(idx)


def _flat(arrs: list, lens: np.ndarray):
    off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    flat = np.concatenate([a[:n] for a, n in zip(arrs, lens)]) if len(arrs) else np.zeros(0, np.int64)
    return flat.astype(np.int64), off


def truncate_traces(prep: PreparedTraces, max_len: Optional[int]) -> PreparedTraces:
    """Every request cut to ``L = min(max_len, its output, both acceptance lists)`` output tokens, so that
    every method and the no-SD baseline generate the same L; ``acc[p]`` capped by the tokens left
    (``L - p``). The n-gram look-up lengths need no change (they depend on the context before ``p``)."""
    lens = [min(int(prep.output_len[i]), len(prep.acc["ngram"][i]), len(prep.acc["eagle3"][i]),
                max_len if max_len else 1 << 62) for i in range(len(prep))]
    acc = {m: [np.minimum(a[:L], L - np.arange(L)).astype(np.int64) for a, L in zip(arrs, lens)]
           for m, arrs in prep.acc.items()}
    avail = None if prep.ngram_avail is None else [a[:L] for a, L in zip(prep.ngram_avail, lens)]
    out = None if prep.output_token_ids is None else [list(o[:L]) for o, L in zip(prep.output_token_ids, lens)]
    return PreparedTraces(prep.dataset.copy(), prep.request_id.copy(), prep.prompt_len.copy(),
                          np.asarray(lens, dtype=np.int64), acc, avail, prep.prompt_token_ids, out)
