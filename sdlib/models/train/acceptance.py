"""Offline acceptance at fit time: what greedy speculative decoding with k drafts would accept on the
trained target's own greedy continuations of held-out prompts (torch only, no vLLM).

The model cards record it (``offline_acceptance``); ``sdlib train check`` and
the sweep measure acceptance in vLLM.

Usage:
    greedy = greedy_samples(target, heldout_prompts(data, 16, 448), eos=1, new_tokens=64, device=dev)
    offline_acceptance("eagle3", target, head, greedy, aux_ids=(1, 3, 5), draft_ids=ids, k=3)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch

from sdlib.models.train.llama import lm_features, lm_logits
from sdlib.models.train.modules import rope, unroll_head


def greedy_samples(target, prompts: list[list[int]], eos: int, new_tokens: int, device,
                   autocast: Callable = contextlib.nullcontext) -> list:
    """Greedy continuations by ``target`` of ``prompts`` (up to ``new_tokens``, stopping at ``eos``):
    ``[(prompt_len, ids (1, L))]``."""
    out = []
    with torch.no_grad(), autocast():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            for _ in range(new_tokens):
                nxt = lm_logits(target, ids)[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
                if int(nxt) == eos:
                    break
            out.append((len(p), ids))
    return out


def offline_acceptance(component: str, target, model, greedy: list, aux_ids: tuple[int, ...],
                       draft_ids: Optional[list[int]], k: int,
                       autocast: Callable = contextlib.nullcontext) -> dict:
    """Acceptance of ``model`` (draft, eagle or eagle3) with k drafts at every position of the
    generated part of each ``greedy`` sample.

    Draft j at verified index v is accepted when drafts 1..j all equal the
    target's tokens; with the tokens so far correct, the drafter's inputs are
    the sequence itself, so one (unrolled) pass gives every base.
    """
    K = k
    acc = [0] * K
    bases = 0
    with torch.no_grad(), autocast():
        for P, seq in greedy:
            L = seq.shape[1]
            if L - K - 2 <= P - 1:
                continue
            if component == "draft":
                arg = lm_logits(model, seq).argmax(-1)[0]  # arg[i] predicts seq[i + 1]
                pred = [arg[j:] for j in range(1, K + 1)]  # step j-1 at base b: arg[b + j]
            else:
                tl, feat, aux = lm_features(target, seq, aux_ids)
                T = L - 1
                emb = target.model.embed_tokens(seq[:, 1:])
                cos, sin = rope(T, model.shape.head_dim, model.rope_theta, seq.device)
                h0 = feat[:, :T] if component == "eagle" else model.combine([a[:, :T] for a in aux])
                pred = []
                for s, x in enumerate(unroll_head(model, emb, h0, cos, sin, K)):
                    a = (target.lm_head(x) if component == "eagle" else model.logits(x)).argmax(-1)[0]
                    if component == "eagle3" and draft_ids is not None:
                        a = torch.tensor(draft_ids, device=seq.device)[a]
                    pred.append(torch.cat([a[s:], a.new_full((1,), -1)]))  # step s at base b: a[b + s]
            s_, pred = seq[0].cpu(), [x.cpu() for x in pred]
            for b in range(P - 1, L - K - 2):
                bases += 1
                for j in range(K):
                    if int(pred[j][b]) == int(s_[b + j + 2]):
                        acc[j] += 1
                    else:
                        break
    cond = [round(acc[j] / (acc[j - 1] if j else bases), 4) if (acc[j - 1] if j else bases) else None
            for j in range(K)]
    return {"k": K, "prompts": len(greedy), "bases": bases, "accepted_per_pos": acc,
            "conditional_rate_per_pos": cond,
            "mean_acceptance_length": round(1 + sum(acc) / bases, 4) if bases else None}
