"""Training losses: next-token CE (+ distillation for the draft) and the heads' unrolled drafting loss.

Each returns ``(loss tensor, metrics dict of tensors)``; metrics whose name
starts with ``_`` are per-token tensors for the per-source held-out CE.

Usage:
    loss, m = lm_loss(logits, ids)                                  # the target
    loss, m = lm_loss(logits, ids, teacher_logits=tl, distill=0.5)  # the draft
    loss, m = head_loss("eagle3", head, target, ids, lm_features(target, ids, aux_ids), draft_ids, cfg, autocast)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from sdlib.models.train.modules import rope, unroll_head


def soft_ce(logits, probs):
    """Soft-label cross-entropy ``-sum p log q`` per position, for (..., V) inputs (float32)."""
    return -(probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


def lm_loss(logits, ids, teacher_logits=None, distill: float = 0.5, src=None):
    """Next-token CE of ``logits`` (B, S, V) on ``ids`` (B, S); with ``teacher_logits``
    (the target's, for the draft): ``(1 - distill) * CE + distill * soft CE to the teacher``."""
    lg = logits[:, :-1].float()
    tgt = ids[:, 1:]
    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
    m = {"ce": ce.mean(), "acc": (lg.argmax(-1) == tgt).float().mean()}
    loss = ce.mean()
    if teacher_logits is not None:
        tl = teacher_logits[:, :-1].float()
        kd = soft_ce(lg, F.softmax(tl, dim=-1))
        loss = (1 - distill) * ce.mean() + distill * kd.mean()
        m["kd"] = kd.mean()
        m["agree"] = (lg.argmax(-1) == tl.argmax(-1)).float().mean()
    if src is not None:
        m["_ce_tok"], m["_src"] = ce, src[:, 1:]
    return loss, m


def head_loss(component: str, head, target, ids, target_out: tuple, draft_ids: Optional[list[int]], cfg,
              autocast: Callable):
    """Unrolled drafting (``cfg.ttt_steps`` steps) of an EAGLE head on the frozen target's features.

    ``target_out``: ``(logits, final hidden, aux states)`` of the target on ``ids``.
    Position p (0 <= p < S-1): token t_{p+1}, feature at p (target at step 0,
    the head's own previous output at p-1 afterwards); label: the target's
    distribution at p+1 (the token after t_{p+1}). Step s is scored where a
    drafting chain can be (p >= s), with weight ``cfg.ttt_decay ** s``;
    EAGLE-1 adds a SmoothL1 regression to the target's next feature.
    """
    tlog, feat, aux = target_out
    S = ids.shape[1]
    T = S - 1
    cos, sin = rope(T, head.shape.head_dim, head.rope_theta, ids.device)
    with torch.no_grad():
        emb = target.model.embed_tokens(ids[:, 1:])
        tl = tlog[:, 1:].float()
        t_arg = tl.argmax(-1)
        if component == "eagle3" and draft_ids is not None:
            dids = torch.tensor(draft_ids, device=ids.device)
            probs = F.softmax(tl[..., dids], dim=-1)
        else:
            dids = None
            probs = F.softmax(tl, dim=-1)
    pos = torch.arange(T, device=ids.device)
    total, wsum, m = 0.0, 0.0, {}
    with autocast():
        if component == "eagle":
            h0 = feat[:, :T].detach()
            feat_next = feat[:, 1:].float()
        else:
            h0 = head.combine([a[:, :T].detach() for a in aux])
        for s, x in enumerate(unroll_head(head, emb, h0, cos, sin, cfg.ttt_steps)):
            logits = target.lm_head(x) if component == "eagle" else head.logits(x)
            valid = (pos >= s).float()[None, :]
            ce = soft_ce(logits, probs)
            w = cfg.ttt_decay ** s
            step_loss = (ce * valid).sum() / (valid.sum() * ids.shape[0])
            if component == "eagle":
                reg = F.smooth_l1_loss(x.float(), feat_next, reduction="none").mean(-1)
                reg = (reg * valid).sum() / (valid.sum() * ids.shape[0])
                m[f"reg{s}"] = reg
                step_loss = reg + cfg.eagle_cls_weight * step_loss
            total = total + w * step_loss
            wsum += w
            with torch.no_grad():
                arg = logits.argmax(-1)
                if dids is not None:
                    arg = dids[arg]
                m[f"ce{s}"] = (ce * valid).sum() / (valid.sum() * ids.shape[0])
                m[f"agree{s}"] = ((arg == t_arg).float() * valid).sum() / (valid.sum() * ids.shape[0])
    return total / wsum, m
