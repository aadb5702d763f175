"""``sdlib train fit``: train the target, the draft, an EAGLE-1 and an EAGLE-3 head from a prepared folder.

In order (:class:`sdlib.models.train.trainer.Trainer`): the target
(``LlamaForCausalLM``, next-token CE), the draft (same tokenizer, distilled on
the target's soft outputs plus the data), then the two heads on the frozen
target (soft-label distillation through the heads' LM heads, feature
regression for EAGLE-1, and "training-time test": 3 drafting steps where each
step sees its own previous outputs, with the attention pattern vLLM's
drafting loop has). A time budget is split across the four stages by
``shares``, with a cosine schedule over each stage's time, or each stage runs
a fixed number of steps (``max_steps``); the best held-out checkpoint of each
model is kept. The defaults are those of the run whose weights are committed
(``data/models/train_logs/run2_shares_25-15-30-30_kept``: 240 s on one H200,
shares 0.25/0.15/0.3/0.3).

Usage:
    sdlib train fit --data .train --dry-run               # the plan (no torch)
    sdlib train fit --data .train --out data/models --device cuda
    sdlib train fit --data .train --out data/models --device cuda \\
        --max-steps target=2147,draft=1500,eagle=1795,eagle3=1606   # the kept run, step for step
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from sdlib.models.train.presets import DATA_FORMAT, MODEL_COMPONENTS


@dataclass
class FitConfig:
    """Training settings (the model shapes come from the configs in the data folder).

    Defaults: the kept run's (``data/models/train_logs/run2_shares_25-15-30-30_kept``).
    """

    time_budget_s: float = 240.0  # all four stages, evaluations and saves included
    #: fractions of the time budget per stage (normalised over the stages still to run)
    shares: dict = field(default_factory=lambda: {"target": 0.25, "draft": 0.15, "eagle": 0.3, "eagle3": 0.3})
    #: optimizer steps instead of the time budget: one int for every stage, or
    #: ``{component: steps}`` (stages not named run on their time budget); None: time budget only
    max_steps: Optional[Union[int, dict]] = None
    batch_size: int = 32  # windows per step (each seq_len tokens)
    seq_len: Optional[int] = None  # default: the data's
    lr: dict = field(default_factory=lambda: {"target": 2e-3, "draft": 3e-3, "eagle": 1e-3, "eagle3": 1e-3})
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    draft_distill: float = 0.5  # weight of the target's soft labels (rest: data tokens)
    ttt_steps: int = 3  # drafting steps unrolled when training the heads (= k)
    ttt_decay: float = 0.8  # weight of step s is decay**s
    eagle_cls_weight: float = 1.0  # EAGLE-1: L = feature SmoothL1 + w * soft CE
    #: EAGLE-1's ``fc`` starts as identity on the feature half, so the head's output
    #: (fed to the target's LM head with no norm) starts at the feature scale
    eagle_fc_identity: bool = True
    #: EAGLE-3: train ``fc`` on the auxiliary states scaled to rms 1 (folded into ``fc.weight``)
    eagle3_aux_scale: bool = False  # tried on the mini set: held-out agreement 0.40 vs 0.66 without
    eval_windows: int = 64
    #: offline acceptance estimate: greedy target continuations of held-out prompts
    accept_prompts: int = 16
    accept_new_tokens: int = 64
    evals_per_stage: int = 5
    log_every: int = 20
    seed: int = 0
    device: str = "cuda"
    compile: bool = False

    def stage_steps(self, component: str) -> Optional[int]:
        """Optimizer steps of ``component``'s stage, or None (it runs on its time budget)."""
        if isinstance(self.max_steps, dict):
            return self.max_steps.get(component)
        return self.max_steps


def plan_summary(data_dir: Path, cfg: FitConfig) -> dict:
    """What ``fit`` would do: parameters, weight bytes, stage budgets or steps, tokens per step (no torch)."""
    prep = json.loads((Path(data_dir) / "prepare.json").read_text())
    S = cfg.seq_len or prep["corpus_plan"]["seq_len"]
    out: dict[str, Any] = {"seq_len": S, "batch_size": cfg.batch_size, "tokens_per_step": S * cfg.batch_size,
                           "time_budget_s": cfg.time_budget_s, "max_steps": cfg.max_steps,
                           "device": cfg.device, "corpus": prep["corpus"], "stages": {}}
    total_bytes = 0
    tot_share = sum(cfg.shares[c] for c in MODEL_COMPONENTS)
    for c in MODEL_COMPONENTS:
        lay = prep["layout"][c]
        n = sum(math.prod(v["shape"]) for v in lay.values() if v["dtype"] in ("BF16", "F32"))
        b = sum(math.prod(v["shape"]) * {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}[v["dtype"]] for v in lay.values())
        total_bytes += b
        out["stages"][c] = {"params": n, "weights_bytes": b, "lr": cfg.lr[c],
                            "budget_s": round(cfg.time_budget_s * cfg.shares[c] / tot_share, 1),
                            "steps": cfg.stage_steps(c),
                            "config": {k: json.loads((Path(data_dir) / "configs" / c / "config.json").read_text())[k]
                                       for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "num_key_value_heads", "head_dim", "intermediate_size")}}
    out["weights_bytes"] = total_bytes
    out["ttt_steps"] = cfg.ttt_steps
    return out


def fit(data_dir: Path, out_dir: Path, cfg: FitConfig, pack_dir: Optional[Path] = None,
        quiet: bool = False) -> dict:
    """Train target, draft, EAGLE-1 and EAGLE-3 from ``data_dir`` into ``out_dir``; returns the log.

    Each stage that fails is recorded (``errors``) and its folder saved untrained
    (``trained: false`` in its card) so the set stays loadable. With ``pack_dir``,
    also writes ``sdlib_models.tar.gz.partNN`` (<= 15 MB each) and ``train_log.json``
    there; without, the log goes to ``<out_dir>_train_log.json`` beside ``out_dir``.
    """
    # deferred: sdlib.models.train.trainer loads torch, and only this path needs it
    from sdlib.models.train.trainer import Trainer

    prep = json.loads((Path(data_dir) / "prepare.json").read_text())
    if prep.get("data_format") != DATA_FORMAT:
        raise ValueError(f"{data_dir}: data format {prep.get('data_format')} != {DATA_FORMAT}; run prepare again")
    return Trainer(data_dir, out_dir, cfg, pack_dir, quiet).run()
