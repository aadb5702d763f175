"""Figure titles built from provenance: what produced the data (models and weights, device, vLLM).

Every notebook titles its figures with these, so a figure says where its data came from.

Usage:
    from sdlib.plots.titles import sweep_title
    title = sweep_title(SweepStore("data/sweeps/embedded_default"), "Speedup over no SD")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from sdlib.paths import resolve
from sdlib.sim.traces import provenance_path
from sdlib.store import SweepStore


def model_note(card: dict[str, Any]) -> str:
    """A short phrase for a model card: what the weights are."""
    if card.get("random_weights"):
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
        notes.append("random weights")
    return [n for n in dict.fromkeys(notes) if n]


def sweep_title(store, what: str = "") -> str:
    """``<what> — <sweep>: <models> (random weights …), <device>, vLLM <version>``, from provenance."""
    store = store if isinstance(store, SweepStore) else SweepStore(store)
    prov = store.read_provenance()
    invs = prov.get("invocations", [])
    cards: dict[str, Any] = {}
    engines: list[dict] = []
    for inv in invs:
        cards.update(inv.get("models", {}))
        engines += inv.get("engines", [])
    models = [m.get("name") for m in prov.get("config", {}).get("models", [])]
    notes = _notes(cards, [m for m in models if m])
    device = next((e.get("device") for e in reversed(engines) if e.get("device")), "")
    ver = next((e.get("vllm_version") for e in reversed(engines) if e.get("vllm_version")), "")
    synthetic = any("synthetic" in str(m.get("options", {})) for m in prov.get("config", {}).get("methods", []))
    parts = [f"{prov.get('sweep', store.dir.name)}: {', '.join(m for m in models if m)}"]
    if notes or synthetic:
        parts.append("(" + ", ".join(notes + (["synthetic acceptance"] if synthetic else [])) + ")")
    tail = ", ".join(x for x in [device.replace("CPU: ", "CPU ") if device else "", f"vLLM {ver}" if ver else ""] if x)
    title = " ".join(parts) + (f"\n{tail}" if tail else "")
    return f"{what}\n{title}" if what else title


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
