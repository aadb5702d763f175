"""The four stages of ``fit`` in order, with the state they share (data, the trained target, the log).

:class:`Trainer` builds each model (:mod:`~sdlib.models.train.llama` for the
target and the draft, :mod:`~sdlib.models.train.modules` for the heads),
trains it (:func:`~sdlib.models.train.stage.train_stage`), estimates its
acceptance offline (:mod:`~sdlib.models.train.acceptance`), saves its folder
and card (:mod:`~sdlib.models.train.export`, :mod:`~sdlib.models.train.cards`),
rewrites the manifest, and packs after every stage, so a run cut short still
leaves a loadable set.

Usage:
    from sdlib.models.train.fit import FitConfig, fit
    log = fit(Path(".train"), Path("/tmp/m"), FitConfig(device="cpu", max_steps=3, batch_size=2))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy
import torch

from sdlib.models.train import acceptance, export, objectives
from sdlib.models.train.cards import model_card
from sdlib.models.train.data import Windows
from sdlib.models.train.files import utc_now, write_json
from sdlib.models.train.llama import lm_features, lm_logits, new_llama
from sdlib.models.train.modules import head_from_config, init_weights
from sdlib.models.train.prepare import heldout_prompts
from sdlib.models.train.presets import MODEL_COMPONENTS, SOURCES
from sdlib.models.train.stage import train_stage

if TYPE_CHECKING:  # an annotation only (fit.py, which defines it, runs this module)
    from sdlib.models.train.fit import FitConfig


class Trainer:
    """Runs the four stages; see :func:`sdlib.models.train.fit.fit`."""

    def __init__(self, data_dir: Path, out_dir: Path, cfg: FitConfig, pack_dir: Optional[Path] = None,
                 quiet: bool = False):
        self.t_start = time.perf_counter()
        self.data_dir, self.out_dir, self.cfg, self.pack_dir = Path(data_dir), Path(out_dir), cfg, pack_dir
        self.quiet = quiet
        self.prep = json.loads((self.data_dir / "prepare.json").read_text())
        self.configs = {c: json.loads((self.data_dir / "configs" / c / "config.json").read_text())
                        for c in MODEL_COMPONENTS}
        self.seq_len = cfg.seq_len or self.prep["corpus_plan"]["seq_len"]
        self.device = torch.device(cfg.device)
        self.cuda = self.device.type == "cuda"
        self.aux_ids = tuple(sorted(self.configs["eagle3"]["eagle_aux_hidden_state_layer_ids"]))
        self.draft_ids = self.prep["eagle3_draft_ids"]
        self.log: dict[str, Any] = {
            "started_utc": utc_now(), "fit_config": dataclasses.asdict(cfg), "seq_len": self.seq_len,
            "device": self._device_name(), "versions": self._versions(), "stages": {}, "errors": {},
            "data": {"prepare_seed": self.prep["seed"], "corpus": self.prep["corpus"]},
        }
        self.modules: dict[str, Any] = {}
        self.greedy: list = []

    # -- bookkeeping
    def say(self, *a):
        if not self.quiet:
            print(f"[fit {time.perf_counter() - self.t_start:6.1f}s]", *a, flush=True)

    def _device_name(self) -> str:
        if self.cuda:
            return torch.cuda.get_device_name(self.device)
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"

    @staticmethod
    def _versions() -> dict:
        return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}

    def autocast(self):
        """bf16 autocast on CUDA; nothing on CPU (float32)."""
        if self.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- models
    def new_module(self, c: str, stage_seed: int):
        """A freshly initialised ``c`` on the device (heads warm-started from the trained target)."""
        std = self.configs[c].get("initializer_range", 0.02)
        if c in ("target", "draft"):
            return new_llama(self.configs[c], stage_seed, std).to(self.device)
        torch.manual_seed(stage_seed)
        m = head_from_config(c, self.configs[c], n_aux=len(self.aux_ids))
        init_weights(m, std)
        if c == "eagle" and self.cfg.eagle_fc_identity:
            H = m.shape.hidden_size
            with torch.no_grad():
                m.fc.weight[:, H:] += torch.eye(H)
        if c == "eagle" and "target" in self.modules:
            m.emb_scale.fill_(self.eagle_emb_scale())
        if c == "eagle3" and "target" in self.modules and self.cfg.eagle3_aux_scale:
            m.aux_scale.fill_(self.eagle3_aux_scale())
        if c == "eagle3" and "target" in self.modules:
            # warm start: the target's LM head rows of the draft vocabulary and its final norm
            t = self.modules["target"]
            ids = torch.tensor(self.draft_ids if self.draft_ids is not None else range(t.config.vocab_size))
            with torch.no_grad():
                m.lm_head.weight.copy_(t.lm_head.weight.detach().cpu()[ids])
                m.norm.weight.copy_(t.model.norm.weight.detach().cpu())
        return m.to(self.device)

    def eagle_emb_scale(self) -> float:
        """rms(target features) / rms(token embeddings) on the first held-out windows."""
        ids = self.eval_ids[:2]
        _, feat, _ = self.target_fwd(ids)
        with torch.no_grad():
            emb = self.modules["target"].model.embed_tokens(ids)
        return float(feat.float().pow(2).mean().sqrt() / emb.float().pow(2).mean().sqrt().clamp_min(1e-8))

    def eagle3_aux_scale(self) -> float:
        """1 / rms(target's auxiliary hidden states) on the first held-out windows."""
        _, _, aux = self.target_fwd(self.eval_ids[:2])
        rms = torch.cat(aux, dim=-1).float().pow(2).mean().sqrt().clamp_min(1e-8)
        return float(1.0 / rms)

    # -- losses (return (loss tensor, metrics dict of tensors))
    def target_fwd(self, ids):
        """(logits, final hidden, aux states) of the frozen target, no grad."""
        with torch.no_grad(), self.autocast():
            return lm_features(self.modules["target"], ids, self.aux_ids)

    def loss_lm(self, c: str, model, ids, src=None):
        with self.autocast():
            logits = lm_logits(model, ids)
        teacher = self.target_fwd(ids)[0] if c == "draft" else None
        return objectives.lm_loss(logits, ids, teacher, self.cfg.draft_distill, src)

    def loss_head(self, c: str, head, ids, src=None):
        return objectives.head_loss(c, head, self.modules["target"], ids, self.target_fwd(ids), self.draft_ids,
                                    self.cfg, self.autocast)

    def loss(self, c, model, ids, src=None):
        return self.loss_lm(c, model, ids, src) if c in ("target", "draft") else self.loss_head(c, model, ids, src)

    # -- evaluation
    def evaluate(self, c: str, model) -> dict:
        """Mean loss and metrics over the held-out windows (+ CE per source for target and draft)."""
        ids, src = self.eval_ids, self.eval_src
        model.eval()
        sums: dict[str, float] = {}
        n = 0
        tok_ce = {s: [0.0, 0] for s in range(len(SOURCES))}
        with torch.no_grad():
            for i in range(0, ids.shape[0], self.cfg.batch_size):
                b, sb = ids[i: i + self.cfg.batch_size], src[i: i + self.cfg.batch_size]
                loss, m = self.loss(c, model, b, sb)
                k = b.shape[0]
                n += k
                sums["loss"] = sums.get("loss", 0.0) + float(loss) * k
                for key, v in m.items():
                    if not key.startswith("_"):
                        sums[key] = sums.get(key, 0.0) + float(v) * k
                if "_ce_tok" in m:
                    for s in range(len(SOURCES)):
                        sel = m["_src"] == s
                        tok_ce[s][0] += float(m["_ce_tok"][sel].sum())
                        tok_ce[s][1] += int(sel.sum())
        model.train()
        out = {k: round(v / max(n, 1), 5) for k, v in sums.items()}
        if any(v[1] for v in tok_ce.values()):
            out["ce_by_source"] = {SOURCES[s]: round(v[0] / v[1], 5) for s, v in tok_ce.items() if v[1]}
        return out

    def greedy_samples(self) -> list:
        """Greedy continuations by the trained target of the first held-out prompts."""
        cfg = self.cfg
        new = cfg.accept_new_tokens
        prompts = heldout_prompts(self.data_dir, cfg.accept_prompts, min(512, self.seq_len - new))
        return acceptance.greedy_samples(self.modules["target"], prompts, self.prep["special_token_ids"]["eos"],
                                         new, self.device, self.autocast)

    def offline_acceptance(self, c: str) -> dict:
        return acceptance.offline_acceptance(c, self.modules["target"], self.modules[c], self.greedy, self.aux_ids,
                                             self.draft_ids, self.cfg.ttt_steps, self.autocast)

    def train_stage(self, c: str, budget_s: float) -> dict:
        return train_stage(self, c, budget_s)

    # -- saving
    def save(self, c: str, stage: dict, trained: bool, error: Optional[str] = None) -> int:
        """Write ``out_dir/c`` (weights, configs, tokenizer files, card); returns its parameter count."""
        sd = export.export_state(c, self.modules[c], self.draft_ids, self.configs[c]["vocab_size"])

        def card(n: int, weights_bytes: int) -> dict:
            return model_card(c, self.configs[c]["architectures"][0], n, weights_bytes, trained, error, stage,
                              self.prep, self.cfg, self.log["device"], self.log["versions"])

        return export.save_folder(self.out_dir, c, sd, self.data_dir, self.prep, card)

    def write_manifest(self, params: dict, complete: bool) -> None:
        export.write_manifest(
            self.out_dir, self.data_dir, self.prep, self.log["versions"],
            params=params, trained=True, random_weights=False, complete=complete,
            training={c: {k: v for k, v in st.items() if k not in ("curve", "evals")}
                      for c, st in self.log["stages"].items()},
            errors=self.log["errors"], corpus=self.prep["corpus"], fit_seed=self.cfg.seed,
            device=self.log["device"], build_s=round(time.perf_counter() - self.t_start, 3),
            trained_utc=utc_now())

    def pack(self) -> list[str]:
        """Packed parts + ``train_log.json`` into ``pack_dir`` (nothing without one)."""
        return [] if self.pack_dir is None else export.pack(self.out_dir, Path(self.pack_dir), self.log)

    # -- all stages
    def run(self) -> dict:
        """Train, save and pack every component in order; returns the log."""
        cfg = self.cfg
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.data = Windows(self.data_dir, self.device, self.seq_len, cfg.seed)
        self.eval_ids, self.eval_src = self.data.heldout(cfg.eval_windows)
        self.say(f"data: {self.data.tokens.size:,} train tokens, {len(self.data.starts):,} docs; "
                 f"{self.eval_ids.shape[0]} held-out windows; device {self.log['device']}")
        t_train0 = time.perf_counter()
        params: dict[str, int] = {}
        for i, c in enumerate(MODEL_COMPONENTS):
            remaining = cfg.time_budget_s - (time.perf_counter() - t_train0)
            share_left = sum(cfg.shares[x] for x in MODEL_COMPONENTS[i:])
            budget = max(1.0, remaining * cfg.shares[c] / share_left)
            err = None
            try:
                if c != "target" and "target" not in self.log["stages"]:
                    raise RuntimeError("the target was not trained")
                st = self.train_stage(c, budget)
                trained = True
                try:
                    if c == "target":
                        self.greedy = self.greedy_samples()
                        st["greedy_samples"] = len(self.greedy)
                    else:
                        st["offline_acceptance"] = self.offline_acceptance(c)
                        self.say(f"{c} offline acceptance: {json.dumps(st['offline_acceptance'])}")
                except Exception:  # noqa: BLE001 - an estimate, not worth a stage
                    self.log["errors"][c + "_acceptance"] = traceback.format_exc()
            except Exception as e:  # noqa: BLE001 - record, save what exists, go on
                err = f"{type(e).__name__}: {e}"
                self.log["errors"][c] = traceback.format_exc()
                self.say(f"{c} FAILED: {err}")
                st, trained = {"error": err}, False
                if self.cuda:
                    torch.cuda.empty_cache()
                if c not in self.modules:
                    try:
                        self.modules[c] = self.new_module(c, cfg.seed * 100 + i)
                    except Exception:  # noqa: BLE001
                        self.log["errors"][c + "_init"] = traceback.format_exc()
            if trained:
                self.log["stages"][c] = st
            else:
                self.log["stages"][c + "_failed"] = st
            if c in self.modules:
                try:
                    params[c] = self.save(c, st, trained, err)
                except Exception:  # noqa: BLE001
                    self.log["errors"][c + "_save"] = traceback.format_exc()
                    self.say(f"{c} SAVE FAILED:\n{self.log['errors'][c + '_save']}")
            self.write_manifest(params, complete=(i == len(MODEL_COMPONENTS) - 1))
            self.log["wall_s"] = round(time.perf_counter() - self.t_start, 2)
            self.pack()
        self.log["finished_utc"] = utc_now()
        self.log["wall_s"] = round(time.perf_counter() - self.t_start, 2)
        self.log["weights_bytes"] = sum((self.out_dir / c / "model.safetensors").stat().st_size
                                        for c in MODEL_COMPONENTS if (self.out_dir / c / "model.safetensors").exists())
        parts = self.pack()
        if self.pack_dir is None:
            write_json(self.out_dir.parent / f"{self.out_dir.name}_train_log.json", self.log)
        self.say(f"done in {self.log['wall_s']} s; weights {self.log['weights_bytes'] / 1e6:.1f} MB"
                 + (f"; packed {parts} into {self.pack_dir}" if parts else ""))
        return self.log
