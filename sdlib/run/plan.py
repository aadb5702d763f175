"""Plan a sweep: check paths before anything starts, the cells still to run grouped by engine, model cards.

Usage:
    from sdlib.run.plan import plan
    groups = plan(sweep, SweepStore(sweep.out_dir))   # {(model, method label): [cells to run]}
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from sdlib.config import ConfigError, SweepConfig
from sdlib.paths import resolve
from sdlib.store import SweepStore


def check_paths(sweep: SweepConfig) -> None:
    """Fail early, in one line, when a local model path is missing (writes @shapes/ folders)."""
    from sdlib.models.shapes import write_shape

    for p in [m.path for m in sweep.models] + [me.model for me in sweep.methods if me.model]:
        if p.startswith("@shapes/"):
            write_shape(p[len("@shapes/"):])
    for i, m in enumerate(sweep.models):
        if m.path.startswith(("@", ".", "/")) and not resolve(m.path).exists():
            hint = " (build the embedded models: python -m sdlib models)" if m.path.startswith("@models/") else ""
            raise ConfigError(f"models.{i}.path: {resolve(m.path)} does not exist{hint}")
    for i, me in enumerate(sweep.methods):
        if me.model and me.model.startswith(("@", ".", "/")) and not resolve(me.model).exists():
            raise ConfigError(f"methods.{i}.model: {resolve(me.model)} does not exist")
        for j, wl in enumerate(sweep.workloads):
            if wl.path and not resolve(wl.path).exists() and wl.source == "local":
                raise ConfigError(f"workloads.{j}.path: {resolve(wl.path)} does not exist")


def model_cards(sweep: SweepConfig) -> dict[str, Any]:
    """What each local model folder says about itself (sdlib_model.json), e.g. random weights."""
    out = {}
    paths = [(m.name, m.path) for m in sweep.models] + [(me.label, me.model) for me in sweep.methods if me.model]
    for name, p in paths:
        d = resolve(p)
        card, manifest = d / "sdlib_model.json", d.parent / "manifest.json"
        if card.exists():
            out[name] = json.loads(card.read_text())
        elif manifest.exists() and (d / "config.json").exists():  # built by sdlib.models.tinymodels: random init
            m = json.loads(manifest.read_text())
            out[name] = {"name": d.name, "kind": "sdlib.models.tinymodels", "seed": m.get("seed"),
                         "random_weights": not m.get("trained", False), "path": p}
        else:
            out[name] = {"path": p}
    return out


def plan(sweep: SweepConfig, store: SweepStore, retry_failed: bool = True) -> "OrderedDict[tuple, list]":
    """Cells still to run, grouped by engine (model, method), in config order."""
    done = store.done_ids()
    failed = set(store.failures().get("run_id", [])) if not retry_failed else set()
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for c in sweep.cells():
        if c.run_id in done or c.run_id in failed:
            continue
        groups.setdefault(c.group, []).append(c)
    return groups
