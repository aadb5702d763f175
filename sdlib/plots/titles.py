"""Figure titles built from provenance: what produced the data (models and weights, device, vLLM).

Every notebook titles its figures with these, so a figure says where its data came from.

Usage:
    from sdlib.plots.titles import sweep_title
    title = sweep_title(SweepStore("data/sweeps/embedded_default"), "Speedup over no SD")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from sdlib.paths import resolve
from sdlib.sim.traces import provenance_path
from sdlib.store import SweepStore
from sdlib.store.provenance import recorded_engine


def model_note(card: dict[str, Any]) -> str:
    """A short phrase for a model card: what the weights are (trained / random / dummy of a real shape)."""
    if card.get("random_weights"):
        if card.get("kind") == "shape" or "dummy" in str(card.get("note", "")):
            return "dummy weights of the real shape"
        return "random weights"
    if card.get("trained"):
        n = card.get("params")
        return f"trained, {n / 1e6:.1f}M params" if n else "trained tiny model"
    return ""


def _notes(cards: dict[str, Any], targets: list[str]) -> list[str]:
    """Title notes: the target's own note, then one for the drafters (trained / random weights)."""
    notes = [model_note(cards[t]) for t in targets if t in cards]
    drafters = [c for n, c in cards.items() if n not in targets]
    if drafters and all(c.get("trained") for c in drafters):
        notes.append("trained drafters")
    elif any(c.get("random_weights") for c in drafters):
        notes.append(model_note(next(c for c in drafters if c.get("random_weights"))))
    return [n for n in dict.fromkeys(notes) if n]


def method_acceptance(method: dict[str, Any]) -> str:
    """Where a method's acceptance comes from, from its config entry: ``real`` (the drafter's own
    proposals verified by the target), ``synthetic L=<x>`` (vLLM's ``rejection_sample_method=synthetic``:
    drafts accepted at random with mean acceptance length L), ``replayed (<policy>)`` (sdlib.vllm.replay:
    acceptance prescribed by traces), or ``none`` (no SD)."""
    if method.get("name") == "none":
        return "none"
    opts = method.get("options") or {}
    if opts.get("rejection_sample_method") == "synthetic":
        L = opts.get("synthetic_acceptance_length")
        return f"synthetic L={L:g}" if isinstance(L, (int, float)) else "synthetic"
    if method.get("replay"):
        return f"replayed ({method['replay']})"
    return "real"


def acceptance_summary(methods: list[dict[str, Any]]) -> str:
    """One phrase for a sweep's acceptance: ``acceptance real (trained drafters verified by the target)``,
    ``synthetic acceptance, L = 1.5, 2.5, 3.5 (vLLM rejection_sample_method=synthetic)``, ``acceptance
    replayed from traces (fixed, oracle, combine)``, or a join of those for a mix."""
    kinds = [method_acceptance(m) for m in methods if m.get("name") != "none"]
    parts = []
    if "real" in kinds:
        parts.append("real acceptance (the drafters' own proposals)")
    syn = sorted({k.split("=", 1)[1] for k in kinds if k.startswith("synthetic L=")}, key=float)
    if syn or "synthetic" in kinds:
        parts.append("synthetic acceptance" + (f", L = {', '.join(syn)}" if syn else "")
                     + " (vLLM rejection_sample_method=synthetic)")
    rep = list(dict.fromkeys(k[len("replayed ("):-1] for k in kinds if k.startswith("replayed (")))
    if rep:
        parts.append(f"acceptance replayed from the authors' traces ({', '.join(rep)})")
    return "; ".join(parts) or "no SD method"


@dataclass
class SweepFacts:
    """What a sweep's provenance says about where its numbers come from (for titles and axis labels)."""

    name: str
    models: list[str]
    weights: list[str]  # model_note phrases: target, then drafters
    acceptance: str  # acceptance_summary
    acceptance_by_label: dict[str, str]  # method label -> method_acceptance
    device: str
    vllm: str
    batch_mode: str
    repeats: int

    def machine(self) -> str:
        """``<device>, vLLM <version>``."""
        return ", ".join(x for x in [self.device.replace("CPU: ", "CPU ") if self.device else "",
                                      f"vLLM {self.vllm}" if self.vllm else ""] if x)

    def all_synthetic(self) -> bool:
        kinds = [v for v in self.acceptance_by_label.values() if v != "none"]
        return bool(kinds) and all(v.startswith("synthetic") for v in kinds)


def invocation_facts(prov: dict, processes: str = "engines") -> tuple[dict, list[dict], list[str]]:
    """From a provenance.json (a sweep's or a serving sweep's): the model cards of every invocation, the records
    of their ``processes`` (``engines`` or ``servers``) in order, and the config's model names."""
    cards: dict[str, Any] = {}
    procs: list[dict] = []
    for inv in prov.get("invocations", []):
        cards.update(inv.get("models", {}))
        procs += inv.get(processes, [])
    models = [m.get("name") for m in prov.get("config", {}).get("models", []) if m.get("name")]
    return cards, procs, models


def sweep_facts(store) -> SweepFacts:
    """:class:`SweepFacts` from a sweep folder's ``provenance.json`` (config, engines, model cards)."""
    store = store if isinstance(store, SweepStore) else SweepStore(store)
    prov = store.read_provenance()
    cfg = prov.get("config", {})
    cards, _, models = invocation_facts(prov, "engines")
    methods = cfg.get("methods", [])
    return SweepFacts(
        name=prov.get("sweep", store.dir.name), models=models, weights=_notes(cards, models),
        acceptance=acceptance_summary(methods),
        acceptance_by_label={m.get("label") or m.get("name"): method_acceptance(m) for m in methods},
        device=_devices(recorded_engine(prov, "device"),
                        max([int(m.get("tensor_parallel_size") or 1) for m in cfg.get("models", [])] or [1])),
        vllm=recorded_engine(prov, "vllm_version"),
        batch_mode=str(cfg.get("batch_mode", "")), repeats=int(cfg.get("repeats", 1) or 1))


def _devices(device: str, tp: int) -> str:
    """``2x NVIDIA H200 (tensor parallel 2)`` for a model split over ``tp`` devices; ``device`` alone otherwise."""
    return f"{tp}x {device} (tensor parallel {tp})" if device and tp > 1 else device


def sweep_title(store, what: str = "", averaged: str = "") -> str:
    """Three lines from provenance: ``<what>``; ``<sweep>: <models> (<weights>); <acceptance>``;
    ``<device>, vLLM <version>[; <averaged>]`` (``averaged``: what each plotted number pools or
    resamples, e.g. an interval note)."""
    store = store if isinstance(store, SweepStore) else SweepStore(store)
    f = sweep_facts(store)
    head = f"{f.name}: {', '.join(f.models)}" + (f" ({', '.join(f.weights)})" if f.weights else "")
    title = f"{head}; {f.acceptance}"
    tail = "; ".join(x for x in [f.machine(), averaged] if x)
    title += f"\n{tail}" if tail else ""
    return f"{what}\n{title}" if what else title


def method_axis_label(facts: SweepFacts) -> str:
    """Axis label for a method axis: says what the labels' suffixes mean (synthetic L, replay policy)."""
    kinds = {v.split(" ")[0] for v in facts.acceptance_by_label.values() if v != "none"}
    if kinds == {"synthetic"}:
        return "method (k, synthetic acceptance L)"
    if kinds == {"replayed"}:
        return "method (k, replay policy; acceptance from traces)"
    if kinds == {"real"}:
        return "method (k; real acceptance)"
    return "method (k; " + ", ".join(sorted(kinds)) + " acceptance)"


def _find_key(obj, key: str):
    """First value of ``key`` anywhere in a nested dict/list (None if absent)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def our_sweep_title(sweep_dir: str | Path, runs: Optional[pd.DataFrame] = None) -> str:
    """``"our sweep: <name>: <models> (random weights ...)"`` (:func:`sweep_title`, from provenance.json);
    :func:`fallback_sweep_title` when the provenance is in an unexpected shape."""
    try:
        return "our sweep: " + sweep_title(SweepStore(Path(sweep_dir)))
    except Exception:  # a provenance file in an unexpected shape must not stop the notebook
        return fallback_sweep_title(sweep_dir, runs)


def fallback_sweep_title(sweep_dir: str | Path, runs: Optional[pd.DataFrame] = None) -> str:
    """``"our sweep: <name>, <models>"`` from the runs table; "(random weights)" if provenance.json says so."""
    sweep_dir = Path(sweep_dir)
    models: list[str] = []
    if runs is not None and "model" in runs.columns:
        models = sorted({str(m) for m in runs["model"].dropna()})
    title = f"our sweep: {sweep_dir.name}" + (f", {', '.join(models)}" if models else "")
    prov = sweep_dir / "provenance.json"
    if prov.exists():
        try:
            if _find_key(json.loads(prov.read_text()), "random_weights") is True:
                title += " (random weights)"
        except (json.JSONDecodeError, OSError):
            pass
    return title


def traces_title(traces: pd.DataFrame) -> str:
    """``our traces of <target folder> (<what its card says>); <device>, vLLM <version>`` for titles,
    from the provenance files of :func:`load_our_traces` output (its ``file`` column)."""
    provs = [json.loads(provenance_path(resolve(f)).read_text()) for f in sorted(set(traces["file"]))]
    targets = sorted({p["target"] for p in provs if p.get("target")})
    parts = []
    for t in targets:
        card_path = resolve(t) / "sdlib_model.json"
        note = model_note(json.loads(card_path.read_text())) if card_path.exists() else ""
        parts.append(f"{t} ({note})" if note else t)
    where = sorted({f"{p.get('device', '?')}, vLLM {p.get('vllm_version', '?')}" for p in provs})
    return "our traces of " + ", ".join(parts) + "; " + "; ".join(where)


def versions_title(old_store, new_store, what: str, averaged: str = "") -> str:
    """Three lines for a figure of the same cells on two sweeps of different vLLM versions: ``<what>``;
    ``<old sweep> (vLLM a) vs <new sweep> (vLLM b): <models> (<weights>); <acceptance>``; ``<device>[; <averaged>]``."""
    fo, fn = (sweep_facts(s) for s in (old_store, new_store))
    models = ", ".join(dict.fromkeys(fo.models + fn.models))
    weights = ", ".join(dict.fromkeys(fo.weights + fn.weights))
    acceptance = fn.acceptance  # the shared cells are the same method labels, so the newer sweep's (a subset) says it
    device = fo.device if fo.device == fn.device else f"{fo.device} / {fn.device}"
    head = (f"{fo.name} (vLLM {fo.vllm or '?'}) vs {fn.name} (vLLM {fn.vllm or '?'}): {models}"
            + (f" ({weights})" if weights else "") + f";\n{acceptance}")
    tail = "; ".join(x for x in [device, averaged] if x)
    return f"{what}\n{head}" + (f"\n{tail}" if tail else "")
