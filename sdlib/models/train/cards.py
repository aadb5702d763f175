"""Model cards: the ``sdlib_model.json`` that ``fit`` writes into each folder, and the
``data/models/README.md`` that ``sdlib train cards`` writes from the cards and a sweep.

The README's numbers all come from files: sizes, training and held-out losses
from the cards, the training runs from ``train_logs/``, and the mean acceptance
length vLLM measured from the sweep's tables.

Usage:
    sdlib train cards                                  # data/models/README.md from data/models + the sweep
    sdlib train cards --models /tmp/m --sweep ''        # another folder, no measured acceptance
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from sdlib.core.registry import METHODS
from sdlib.models.train.files import utc_now
from sdlib.models.train.presets import MODEL_COMPONENTS


def objective(component: str, cfg) -> str:
    """What ``component`` was trained to do, in words, with the weights of ``cfg`` (a FitConfig)."""
    return {
        "target": "next-token cross-entropy on whole chat documents",
        "draft": f"{1 - cfg.draft_distill:g} x next-token CE + {cfg.draft_distill:g} x "
                 "soft CE to the target's distribution",
        "eagle": f"feature SmoothL1 + {cfg.eagle_cls_weight:g} x soft CE to the target "
                 f"(target lm_head), {cfg.ttt_steps} unrolled drafting steps",
        "eagle3": f"soft CE to the target's distribution over the draft vocabulary, "
                  f"{cfg.ttt_steps} unrolled drafting steps (training-time test)",
    }[component]


def model_card(component: str, architecture: str, params: int, weights_bytes: int, trained: bool,
               error: Optional[str], stage: dict, prep: dict, cfg, device: str, versions: dict) -> dict:
    """The ``sdlib_model.json`` of one trained (or, after a failure, untrained) folder.

    ``stage``: the stage's log (steps, losses, held-out evaluation, offline
    acceptance); ``prep``: ``prepare.json``; ``cfg``: the FitConfig.
    """
    corpus = prep["corpus"]
    return {
        "component": component,
        "architecture": architecture,
        "params": params,
        "weights_bytes": weights_bytes,
        "random_weights": not trained,
        "trained": trained,
        "error": error,
        "objective": objective(component, cfg),
        "corpus": {"description": corpus["description"], "sources": corpus["sources"],
                   "train_docs": corpus["train_docs"], "train_tokens": corpus["train_tokens"],
                   "heldout_docs": corpus["heldout_docs"], "heldout_tokens": corpus["heldout_tokens"],
                   "prepare_seed": prep["seed"], "heldout_seed": prep["heldout_seed"]},
        "training": {k: v for k, v in stage.items() if k not in ("curve", "evals")},
        "final_train_loss": stage.get("final_train_loss"),
        "offline_acceptance": stage.get("offline_acceptance"),
        "heldout_loss": (stage.get("heldout") or {}).get("loss"),
        "seed": cfg.seed,
        "device": device,
        "time_s": stage.get("train_s"),
        "versions": versions,
        "created_utc": utc_now(),
    }


def cards_markdown(models: Path, sweep_dir: Optional[Path] = None) -> str:
    """``data/models/README.md``: one section per model from its ``sdlib_model.json`` card, plus the
    mean acceptance length vLLM measured for each drafter in ``sweep_dir`` (per dataset, all batch sizes).

    The measured numbers live here, not in the cards: a card is part of its model folder's
    fingerprint (run ids), so writing into it would orphan the sweep that measured it.
    """
    models = Path(models)
    man = json.loads((models / "manifest.json").read_text())
    measured = None
    if sweep_dir is not None and Path(sweep_dir).exists():
        # deferred: sdlib.analysis.measures loads pandas, and only this path needs it
        from sdlib.analysis.measures import acceptance_by_method
        from sdlib.store import read_table

        runs, steps = read_table(sweep_dir, "runs"), read_table(sweep_dir, "steps")
        if len(runs) and len(steps):
            measured = acceptance_by_method(steps, runs)
            method_of_label = dict(zip(runs["method_label"], runs["method"]))
            k_of_label = dict(zip(runs["method_label"], runs["num_spec_tokens"]))
            measured = measured.assign(method=measured["method_label"].map(method_of_label),
                                       k=measured["method_label"].map(k_of_label))
    method_of = {m.trained: m.name for m in METHODS.values() if m.trained}  # our trained folder -> its method
    lines = ["# The embedded models (trained)", "",
             "Written by `sdlib train cards` from each folder's `sdlib_model.json` (the model card",
             "`fit` wrote) and, for acceptance in vLLM, from the sweep's tables. Retrain from scratch:",
             "`sdlib train prepare --out .train` (CPU, here), then `sdlib train fit --data .train",
             "--out data/models --device cuda --time-budget-s 240 --shares 0.25,0.15,0.3,0.3` (GPU, about 4 min).",
             "", f"Tokenizer: byte-level BPE, {man.get('vocab_size')} tokens (`tokenizer/`).", ""]
    logs = sorted(p.parent.name for p in (models / "train_logs").glob("*/train_log.json"))
    if logs:
        lines += ["Training runs, as `fit` logged them on the device (`train_log.json`: config, device, "
                  "versions, every evaluation; `fit_stdout.log.gz`): "
                  + ", ".join(f"`train_logs/{n}/`" for n in logs) + ".", ""]
    for c in MODEL_COMPONENTS:
        card = json.loads((models / c / "sdlib_model.json").read_text())
        tr = card.get("training", {})
        lines += [f"## {c}: `{card.get('architecture')}`, {card.get('params', 0) / 1e6:.2f}M parameters", "",
                  f"- objective: {card.get('objective')}",
                  f"- trained: {tr.get('steps')} steps, {tr.get('tokens_seen', 0) / 1e6:.1f}M tokens "
                  f"({tr.get('epochs')} epochs of the corpus), {tr.get('train_s')} s on {card.get('device')}, "
                  f"seed {card.get('seed')}; kept step {tr.get('kept_step')} (best held-out)",
                  f"- final training loss {card.get('final_train_loss')}; held-out loss {card.get('heldout_loss')}"]
        off = card.get("offline_acceptance")
        if off:
            lines.append(f"- acceptance estimated offline in torch at fit time (k={off['k']}, {off['prompts']} "
                         f"held-out prompts): mean acceptance length {off['mean_acceptance_length']:.2f}")
        if measured is not None and c in method_of:
            m = measured[measured["method"] == method_of[c]]
            if len(m):
                per = ", ".join(f"{r.dataset} {r.mean_acceptance_length:.2f}" for r in m.itertuples())
                ks = "/".join(str(int(k)) for k in sorted(set(m["k"])))
                lines.append(f"- **measured in vLLM** (`{Path(sweep_dir).name}`, k={ks}, held-out prompts, "
                             f"all batch sizes): mean acceptance length {per}")
        lines.append("")
    if measured is not None and len(measured):
        t = measured.pivot_table(index="method_label", columns="dataset", values="mean_acceptance_length")
        ks = "/".join(str(int(k)) for k in sorted(set(measured["k"])))
        lines += [f"## Mean acceptance length measured in vLLM (`{Path(sweep_dir).name}`, k={ks}, steps that drafted)", "",
                  "| method | " + " | ".join(t.columns) + " |", "| --- |" + " --- |" * len(t.columns)]
        lines += [f"| {i} | " + " | ".join(f"{v:.2f}" for v in r) + " |" for i, r in t.iterrows()]
        lines.append("")
    corpus = json.loads((models / "target" / "sdlib_model.json").read_text()).get("corpus", {})
    if corpus:
        lines += ["## Corpus", "", corpus.get("description", ""), ""]
        for src, st in corpus.get("sources", {}).items():
            lines.append(f"- {src}: {st.get('train_docs')} training documents ({st.get('train_tokens')} tokens), "
                         f"{st.get('heldout_docs')} held out")
        lines.append("")
    return "\n".join(lines)
