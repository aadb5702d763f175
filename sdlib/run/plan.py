"""Plan a sweep: check paths before anything starts, the cells still to run grouped by engine, model cards.

Usage:
    from sdlib.run.plan import plan
    groups = plan(sweep, SweepStore(sweep.out_dir))   # {(model, method label): [cells to run]}
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from sdlib.config import SweepConfig
from sdlib.paths import resolve
from sdlib.store import SweepStore


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


def group_cells(cells) -> "OrderedDict[tuple, list]":
    """Cells grouped by engine (model, method), in the order given."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    return groups


def done_in_whole_parts(cells, done: set[str]) -> set[str]:
    """The run ids of ``done`` cells whose part (model, dataset, batch size, engine start, repeat: ``part_key``) is
    done whole among ``cells``. A GPU session resumes only those (gpu/resume_cells.py): the powered analysis pairs
    arms within a part, so one left half done is run again whole, on one machine."""
    parts: dict = {}
    for c in cells:
        parts.setdefault(c.part_key, set()).add(c.run_id)
    return {rid for ids in parts.values() if ids <= done for rid in ids}


def plan(sweep: SweepConfig, store: SweepStore, retry_failed: bool = True) -> "OrderedDict[tuple, list]":
    """Cells still to run, grouped by engine (model, method), in config order."""
    done = store.done_ids()
    failed = set(store.failures().get("run_id", [])) if not retry_failed else set()
    return group_cells(c for c in sweep.cells() if c.run_id not in done and c.run_id not in failed)
