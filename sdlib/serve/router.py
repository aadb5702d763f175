"""Routing rules for a fleet of servers: which server each request goes to, decided at admission from the
request alone (its task, or a prompt-overlap score), in arrival order.

Rules (``FleetConfig.rule``):

* ``round_robin``: server ``i mod n`` for the i-th request (replicas of one method);
* ``random``: uniform, seeded;
* ``task``: ``routes[task]``, else ``default`` (e.g. code editing -> the n-gram server);
* ``overlap``: :func:`prompt_overlap_score` >= ``threshold`` -> ``routes["high"]``, else ``routes["low"]``.

The prompt-overlap score is the share of the prompt's positions at which vLLM's n-gram look-up (the one
rule, :func:`sdlib.extract.ngram.ngram_lookup_lengths`) finds an earlier occurrence of the suffix n-gram,
reading the prompt as if it were being generated: prompts that repeat themselves (code) score high, and
outputs that copy their prompt (code edits) are where n-gram drafting accepts most.

The router runs in the client process, in front of the servers (no proxy hop, so it adds no latency).

Usage:
    from sdlib.serve.router import Router, prompt_overlap_score
    r = Router("task", n_servers=2, routes={"code_edit": 0}, default=1)
    r.route(task="chat", prompt=[1, 2, 3])   # -> 1
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from sdlib.extract.ngram import NGRAM_MAX, NGRAM_MIN, ngram_lookup_lengths


def prompt_overlap_score(prompt: Sequence[int], nmin: int = NGRAM_MIN, nmax: int = NGRAM_MAX) -> float:
    """Share of positions ``p`` of ``prompt`` whose preceding ``nmin..nmax``-gram occurred earlier in
    ``prompt[:p]`` (vLLM's n-gram look-up applied to the prompt itself); 0 for prompts shorter than ``nmin + 1``."""
    ids = list(map(int, prompt))
    if len(ids) <= nmin:
        return 0.0
    hits = ngram_lookup_lengths([], ids, nmin=nmin, nmax=nmax, max_k=1)
    return float(np.count_nonzero(hits[nmin:]) / (len(ids) - nmin))


class Router:
    """Assigns requests to servers by one rule (see the module docstring); stateful for round robin."""

    def __init__(self, rule: str, n_servers: int, routes: Optional[dict[str, int]] = None, default: int = 0,
                 threshold: float = 0.5, seed: int = 0):
        if rule not in ("round_robin", "random", "task", "overlap", "single"):
            raise ValueError(f"rule: {rule!r} is not a routing rule")
        self.rule = rule
        self.n = int(n_servers)
        self.routes = dict(routes or {})
        self.default = int(default)
        self.threshold = float(threshold)
        self._rng = np.random.default_rng(seed)
        self._next = 0

    def route(self, task: str = "", prompt: Sequence[int] = (), score: Optional[float] = None) -> int:
        """The server index for one request, at its admission."""
        if self.rule == "single" or self.n == 1:
            return 0
        if self.rule == "round_robin":
            i = self._next % self.n
            self._next += 1
            return i
        if self.rule == "random":
            return int(self._rng.integers(self.n))
        if self.rule == "task":
            return int(self.routes.get(task, self.default))
        s = prompt_overlap_score(prompt) if score is None else score
        return int(self.routes["high"] if s >= self.threshold else self.routes["low"])
