"""One stage of ``fit``: the optimisation loop of one component (AdamW, warm-up + cosine, clipping),
periodic held-out evaluations, and the best held-out checkpoint.

A stage runs for its time budget, or for a fixed number of optimizer steps
(``FitConfig.max_steps``): with the step counts a run logged
(``train_log.json``: ``stages.<c>.steps``) a stage takes as many steps, on the
same batches, from the same initial weights.

Usage:
    st = train_stage(trainer, "eagle3", budget_s=60.0)   # what Trainer.run does for each component
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import torch

from sdlib.models.train.presets import MODEL_COMPONENTS


def param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def lr_at(cfg, base: float, step: int, progress: float) -> float:
    """Linear warm-up over ``cfg.warmup_steps``, then a cosine from ``base`` to
    ``base * cfg.min_lr_ratio`` over ``progress`` in [0, 1]."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    cos = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return base * warm * cos


def optimizer(cfg, module, lr: float, device):
    """AdamW with weight decay on matrices only (fused on CUDA)."""
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    kw = {"fused": True} if str(device).startswith("cuda") else {}
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=cfg.betas, **kw)


def train_stage(tr, c: str, budget_s: float) -> dict:
    """Train component ``c`` for ``budget_s`` seconds, or for ``tr.cfg.stage_steps(c)`` optimizer steps
    when set; ``tr`` is the :class:`~sdlib.models.train.trainer.Trainer`. The learning rate warms up, then
    follows a cosine over the elapsed fraction of the budget (of the steps); the best of
    ``evals_per_stage`` held-out evaluations is kept. Returns the stage's log; the module is left frozen
    in ``tr.modules[c]``."""
    cfg = tr.cfg
    sidx = MODEL_COMPONENTS.index(c)
    model = tr.new_module(c, cfg.seed * 100 + sidx)
    tr.modules[c] = model
    if c in ("eagle", "eagle3"):
        for p in tr.modules["target"].parameters():
            p.requires_grad_(False)
    n_params = param_count(model)
    opt = optimizer(cfg, model, cfg.lr[c], tr.device)
    data = tr.data
    data.reseed(cfg.seed * 100 + sidx)
    step_fn = tr.loss
    if cfg.compile and tr.cuda and c == "target":
        model_c = torch.compile(model)
    else:
        model_c = model
    tok_per_step = cfg.batch_size * tr.seq_len
    st: dict[str, Any] = {"params": n_params, "budget_s": round(budget_s, 2), "batch_size": cfg.batch_size,
                          "seq_len": tr.seq_len, "lr": cfg.lr[c], "curve": [], "evals": []}
    n_steps = cfg.stage_steps(c)
    tr.say(f"{c}: {n_params / 1e6:.2f}M parameters, "
           + (f"{n_steps} steps" if n_steps is not None else f"budget {budget_s:.0f} s"))
    eval_at = [budget_s * (i + 1) / cfg.evals_per_stage for i in range(cfg.evals_per_stage)]
    if n_steps is not None:
        eval_at = sorted({max(1, round(n_steps * (i + 1) / cfg.evals_per_stage))
                          for i in range(cfg.evals_per_stage)})
    best = (float("inf"), None, -1)
    t0 = time.perf_counter()
    step, last_log_t, last_log_step = 0, t0, 0
    loss_acc = None
    while True:
        el = time.perf_counter() - t0
        if n_steps is not None:
            if step >= n_steps:
                break
            progress = step / n_steps
        else:
            if el >= budget_s:
                break
            progress = el / budget_s
        lr = lr_at(cfg, cfg.lr[c], step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        # heads score S-1 positions: one more token makes that a multiple of 8 (masked SDPA)
        ids = data.batch(cfg.batch_size, extra=1 if c in ("eagle", "eagle3") else 0)
        loss, m = step_fn(c, model_c, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        if step % cfg.log_every == 0 or step == 1:
            lv = float(loss_acc) / (step - last_log_step)
            loss_acc = None
            now = time.perf_counter()
            tps = (step - last_log_step) * tok_per_step / max(now - last_log_t, 1e-9)
            st["curve"].append({"step": step, "t_s": round(now - t0, 2), "loss": round(lv, 4),
                                "lr": lr, "tok_per_s": round(tps)})
            tr.say(f"{c} step {step} loss {lv:.4f} lr {lr:.2e} {tps / 1e3:.0f}k tok/s "
                     f"epoch {data.epoch}")
            last_log_t, last_log_step = now, step
        if eval_at and ((step >= eval_at[0]) if n_steps is not None else (time.perf_counter() - t0 >= eval_at[0])):
            eval_at.pop(0)
            ev = tr.evaluate(c, model)
            ev.update(step=step, t_s=round(time.perf_counter() - t0, 2))
            st["evals"].append(ev)
            tr.say(f"{c} eval step {step}: " + json.dumps({k: v for k, v in ev.items()
                                                              if k not in ("step", "t_s")}))
            if ev["loss"] < best[0]:
                best = (ev["loss"], {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    if tr.cuda:
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    final_train = float(loss_acc) / (step - last_log_step) if loss_acc is not None else (
        st["curve"][-1]["loss"] if st["curve"] else None)
    if not st["evals"] or st["evals"][-1]["step"] != step:
        ev = tr.evaluate(c, model)
        ev.update(step=step, t_s=round(time.perf_counter() - t0, 2))
        st["evals"].append(ev)
        if ev["loss"] < best[0]:
            best = (ev["loss"], None, step)
    if best[1] is not None and best[2] != step:
        model.load_state_dict(best[1])
        tr.say(f"{c}: keeping the best held-out checkpoint (step {best[2]})")
    chosen = next(e for e in st["evals"] if e["step"] == best[2]) if best[2] >= 0 else st["evals"][-1]
    st.update(steps=step, tokens_seen=step * tok_per_step, train_s=round(train_s, 2),
              tok_per_s=round(step * tok_per_step / max(train_s, 1e-9)),
              epochs=round(step * tok_per_step / max(1, data.tokens.size), 3),
              final_train_loss=None if final_train is None else round(final_train, 5),
              heldout=chosen, kept_step=best[2] if best[2] >= 0 else step)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return st
