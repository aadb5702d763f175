"""EAGLE-3's own confidence in each draft token, along one of our traces' outputs (torch, no vLLM).

For every verify step of a trace (a request's output position ``q >= 1``, context = prompt + output[:q]) the
head drafts ``k`` tokens; ``conf[q][j]`` is the top-1 probability (softmax over the head's draft vocabulary)
of draft ``j``, the signal a confidence-stopping drafter reads after drafting token ``j`` and before
deciding to draft the next. The chain runs as an engine drafts: step 0 reads the target's features and the
real context, each later step reads the head's own previous draft (after a rejected draft too: a stopping
rule must not see confidences computed from tokens no engine has). One pass per request gives every
position's chain at once (the drafting loop of :func:`sdlib.models.train.modules.unroll_head`, the one the
heads were trained with, fed the drafts instead of the output).

The same pass gives the head's greedy acceptance ``acc[q]`` (1 + drafts equal to the output, capped as the
traces are: ``min(k + 1, len(output) - q)``), which is checked against the trace's ``acc_eagle`` (vLLM's,
:mod:`sdlib.run.traces`): where they agree, the confidences belong to the drafts vLLM verified. The
fraction that agrees is written in the provenance (float32 here against bfloat16 in vLLM: a few positions
differ where two tokens are nearly tied).

Output: JSONL(.gz), one line per request: ``id``, ``conf_eagle`` (``[[]] + [[k floats] per q >= 1]``;
a row is shorter where the chain runs past the output) and ``acc_eagle_offline``; a provenance JSON beside it.

Usage:
    sdlib confidences --traces data/traces/embedded_code_edit.jsonl.gz --models data/models \\
        --out data/traces/confidences/embedded_code_edit.jsonl.gz
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from sdlib.models.train.files import write_gz, write_json
from sdlib.paths import TRAINED_MODELS_DIR, repo_relative, resolve
from sdlib.store.files import sha256_file

#: Decimal places kept for a probability in the JSONL (it is compared with thresholds, not re-derived).
DECIMALS = 5


@dataclass
class Eagle3Offline:
    """The target (transformers, float32) and the EAGLE-3 head (training module, float32) of a model folder."""

    target: Any
    head: Any
    draft_ids: Any  # (draft vocab,) target token id of each draft-vocabulary index
    aux_ids: tuple[int, ...]
    target_dir: Path
    head_dir: Path


def load_eagle3(models: str | Path, target: str = "target", head: str = "eagle3", device: str = "cpu") -> Eagle3Offline:
    """The target and EAGLE-3 head of a models folder (``@trained`` = data/models), as vLLM loads them: the
    head's exported weights (``fc`` with the training scale folded in) and its ``d2t`` map; float32, on
    ``device`` (a torch device: ``cpu``, ``cuda``; ``auto`` = cuda when there is one)."""
    # deferred: torch takes seconds to import, and only this path needs it
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    # deferred: sdlib.models.train.modules loads torch, and only this path needs it
    from sdlib.models.train.modules import head_from_config

    root = TRAINED_MODELS_DIR if str(models).rstrip("/") == "@trained" else resolve(str(models))
    tdir, hdir = root / target, root / head
    for d in (tdir, hdir):
        if not (d / "config.json").is_file():
            raise FileNotFoundError(f"--models: no model folder {d}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tgt = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval().to(device)
    cfg = json.loads((hdir / "config.json").read_text())
    sd = load_file(str(hdir / "model.safetensors"))
    d2t = sd.pop("d2t", None)
    sd.pop("t2d", None)
    mod = head_from_config("eagle3", cfg).float().eval()
    mod.load_state_dict({k: v.float() for k, v in sd.items()})
    mod = mod.to(device)
    n = mod.lm_head.out_features
    ids = (torch.arange(n) + (d2t if d2t is not None else 0)).to(device)
    return Eagle3Offline(tgt, mod, ids, tuple(sorted(cfg["eagle_aux_hidden_state_layer_ids"])), tdir, hdir)


def chain_confidences(m: Eagle3Offline, prompt: Sequence[int], output: Sequence[int],
                      k: int) -> tuple[list[list[float]], list[int]]:
    """(``conf``, ``acc``) of one request: ``conf[q][j]`` the top-1 probability of draft ``j`` at output
    position ``q`` (``conf[0] = []``, the prefill), ``acc[q]`` the head's greedy gain there (``acc[0] = 1``)."""
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    # deferred: sdlib.models.train.llama loads torch, and only this path needs it
    from sdlib.models.train.llama import lm_features
    from sdlib.models.train.modules import rope

    P, out = len(prompt), list(output)
    Lo = len(out)
    seq = torch.tensor([list(prompt) + out], device=m.draft_ids.device)
    T = seq.shape[1] - 1
    conf: list[list[float]] = [[]]
    acc = [1]
    if Lo < 2 or P < 1:
        return conf + [[] for _ in range(1, Lo)], acc + [1] * (Lo - 1)
    with torch.no_grad():
        _, _, aux = lm_features(m.target, seq, m.aux_ids)
        emb = m.target.model.embed_tokens(seq[:, 1:])
        cos, sin = rope(T, m.head.shape.head_dim, m.head.rope_theta, seq.device)
        h0 = m.head.combine([a[:, :T] for a in aux])
        p1, tok = [], []
        caches = [[] for _ in m.head.blocks()]
        h, e = h0, emb
        for s in range(k):  # unroll_head's loop, fed its own drafts: step s at index i continues base i - s
            x = m.head.step(e, h, cos, sin, caches, s)
            pr, a = m.head.logits(x).softmax(-1)[0].max(-1)
            ids = m.draft_ids[a]  # step s at index i drafts the token at index i + 2
            p1.append(pr.cpu().numpy())
            tok.append(ids.cpu().numpy())
            h = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
            # step s + 1 at index i reads the token at i + 1 of its chain: step s's draft at i - 1 (free-running,
            # as an engine drafts; teacher forcing would read the true token, which no engine has after a
            # rejected draft)
            e = m.target.model.embed_tokens(torch.cat([ids[:1], ids[:-1]])[None])
    o = np.asarray(out)
    for q in range(1, Lo):
        b = P + q - 2  # the base: its last known token is seq[b + 1] = output[q - 1]
        n = min(k, T - b)  # drafts whose step index stays inside the pass
        conf.append([round(float(p1[j][b + j]), DECIMALS) for j in range(n)])
        m_ = 0
        while m_ < n and q + m_ < Lo and int(tok[m_][b + m_]) == int(o[q + m_]):
            m_ += 1
        acc.append(min(1 + m_, k + 1, Lo - q))
    return conf, acc


def write_confidences(traces: str | Path, models: str | Path, out: str | Path, k: Optional[int] = None,
                      progress: bool = True, argv: Optional[list[str]] = None, device: str = "cpu") -> dict:
    """Confidences of every request of one of our trace files (``k``: the trace's, from its provenance);
    returns the provenance written beside ``out`` (``argv``: the command line that asked for it; ``device``:
    where the models run, :func:`load_eagle3`)."""
    # deferred: sdlib.sim.traces loads pandas, and only this path needs it
    from sdlib.sim.traces import TRACE_KEYS, provenance_path, read_trace_file
    from sdlib.store import git_commit, utc_now

    src = resolve(str(traces))
    if not src.is_file():
        raise FileNotFoundError(f"--traces: no file {src}")
    if k is not None and k < 1:
        raise ValueError(f"--k: want an integer >= 1, got {k}")
    prov_in = json.loads(provenance_path(src).read_text()) if provenance_path(src).exists() else {}
    k = int(k or prov_in.get("k") or 0)
    if k < 1:
        raise ValueError(f"--k: {src} has no provenance with k; give --k")
    t0 = time.perf_counter()
    m = load_eagle3(models, device=device)
    rows = read_trace_file(src, prov_in.get("dataset", ""), methods={"eagle3": TRACE_KEYS["eagle3"]})
    if rows.empty:
        raise ValueError(f"--traces: {src} has no EAGLE-3 acceptance lists ({TRACE_KEYS['eagle3']})")
    lines, agree, total = [], 0, 0
    for i, r in enumerate(rows.itertuples(index=False)):
        conf, acc = chain_confidences(m, r.prompt_token_ids, r.output_token_ids, k)
        n = min(len(r.acc_len), len(acc))
        agree += sum(int(a == b) for a, b in zip(acc[1:n], r.acc_len[1:n]))
        total += max(n - 1, 0)
        lines.append(json.dumps({"id": r.request_id, "conf_eagle": conf, "acc_eagle_offline": acc}))
        if progress:
            print(f"confidences: {i + 1}/{len(rows)} requests", file=sys.stderr, flush=True)
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    write_gz(tmp, ("\n".join(lines) + "\n").encode())  # byte-stable
    tmp.replace(dst)
    info = {"written_at": utc_now(), "git_commit": git_commit(), "traces": repo_relative(src),
            "traces_sha256": sha256_file(src), "dataset": prov_in.get("dataset"), "k": k,
            "target": repo_relative(m.target_dir), "head": repo_relative(m.head_dir),
            "confidence": "top-1 softmax probability of each draft over the head's draft vocabulary (float32)",
            **({} if str(m.draft_ids.device) == "cpu" else {"device": str(m.draft_ids.device)}),
            "agreement_with_trace_acc_eagle": {"positions": total, "equal": agree,
                                               "fraction": round(agree / total, 6) if total else None},
            "seconds": round(time.perf_counter() - t0, 1),
            "argv": ["sdlib", "confidences", *(argv if argv is not None else sys.argv[1:])]}
    write_json(provenance_path(dst), info)
    return info
