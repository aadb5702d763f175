"""Training and held-out token windows of a prepared folder, on the training device.

Training windows start at document starts (so at position 0 with ``<s>``),
in a seeded epoch order that each stage restarts (:meth:`Windows.reseed`);
held-out windows go round-robin over the sources.

Usage:
    w = Windows(Path(".train"), torch.device("cpu"), seq_len=1024, seed=0)
    ids = w.batch(32)                      # (32, 1024) int64
    ids, src = w.heldout(64)               # + the source index of each token
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sdlib.models.train.files import load_npy_gz
from sdlib.models.train.presets import SOURCES


class Windows:
    """Token windows that start at document starts (so at position 0 with ``<s>``)."""

    def __init__(self, data_dir: Path, device, seq_len: int, seed: int):
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        self.tokens = load_npy_gz(data_dir / "train_tokens.npy.gz")
        docs = load_npy_gz(data_dir / "train_docs.npy.gz")
        self.starts = np.minimum(docs[:, 0], max(0, self.tokens.size - seq_len - 1))
        self.seq_len = seq_len
        self.reseed(seed)
        self.device = device
        self.tok = torch.from_numpy(self.tokens.astype(np.int32)).to(device)
        self.ar = torch.arange(seq_len + 1, device=device)
        # held-out windows, spread over the sources in turn
        ht = load_npy_gz(data_dir / "heldout_tokens.npy.gz")
        hd = load_npy_gz(data_dir / "heldout_docs.npy.gz")
        self.h_tokens = ht
        self.h_docs = hd
        src_tok = np.repeat(hd[:, 2], hd[:, 1]).astype(np.int64)
        self.h_src = src_tok

    def reseed(self, seed: int) -> None:
        """Restart the epoch order from ``seed`` (each stage has its own)."""

        self.rng = np.random.default_rng(seed)
        self.perm, self.pos, self.epoch = self.rng.permutation(len(self.starts)), 0, 0

    def batch(self, B: int, extra: int = 0):
        """(B, seq_len + extra) token ids (int64) on the device (``extra`` <= 1)."""
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        idx = []
        while len(idx) < B:
            if self.pos >= len(self.perm):
                self.perm, self.pos, self.epoch = self.rng.permutation(len(self.starts)), 0, self.epoch + 1
            take = self.perm[self.pos: self.pos + B - len(idx)]
            self.pos += len(take)
            idx.extend(take.tolist())
        st = torch.from_numpy(self.starts[np.array(idx)]).to(self.device)
        return self.tok[st[:, None] + self.ar[None, : self.seq_len + extra]].long()

    def heldout(self, n: int):
        """(ids, source of each token) for up to ``n`` windows, round-robin over sources."""
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        by_src = [np.flatnonzero(self.h_docs[:, 2] == s) for s in range(len(SOURCES))]
        order, i = [], 0
        while len(order) < min(n, len(self.h_docs)):
            for docs in by_src:
                if i < len(docs) and len(order) < n:
                    order.append(docs[i])
            i += 1
        S, N = self.seq_len, self.h_tokens.size
        starts = np.minimum(self.h_docs[np.array(order, dtype=np.int64), 0], max(0, N - S))
        idx = starts[:, None] + np.arange(S)[None, :]
        ids = torch.from_numpy(self.h_tokens[idx].astype(np.int64)).to(self.device)
        src = torch.from_numpy(self.h_src[idx]).to(self.device)
        return ids, src
