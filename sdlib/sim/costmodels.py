"""The one way to get a cost model: by built-in name, by ``data/costmodels/<name>.json``, or by path, of either
kind (:class:`~sdlib.sim.costmodel.CostModel`, linear; :class:`~sdlib.sim.engine_costs.EngineCostModel`, per
engine path and k). Both implement :class:`~sdlib.sim.costmodel.StepCostModel`, the protocol the simulator
prices steps through.

A JSON file's ``"kind"`` says which class reads it (absent: ``linear``). An engine model's ``prefill_model``
(a name or a repo-relative path) is resolved here, by the same rule, when the engine model is loaded.

Usage:
    from sdlib.sim.costmodels import load_cost_model, load_cost_models
    cm = load_cost_model("h200_replay_engine")          # data/costmodels/h200_replay_engine.json
    cm = load_cost_model("authors_h100_llama8b")        # built in
    cms = load_cost_models(["data/costmodels/h200_llama8b.json"])   # the authors' fit + the linear ones
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Iterable, Optional

from sdlib.paths import DATA_DIR, REPO_ROOT, resolve
from sdlib.sim.costmodel import AUTHORS_H100_LLAMA8B, COST_MODELS, CostModel, StepCostModel
from sdlib.sim.engine_costs import EngineCostModel

#: Where named cost models live (``<name>.json``).
COST_MODEL_DIR = DATA_DIR / "costmodels"
#: Cost-model classes by the ``kind`` of their JSON.
KINDS: dict[str, type[StepCostModel]] = {cls.kind: cls for cls in (CostModel, EngineCostModel)}


class CostModelError(ValueError):
    """No cost model by that name or path, or a file that is not one (the CLI prints it as one line)."""


def cost_model_names() -> list[str]:
    """The names :func:`load_cost_model` knows without a path: built-ins, then ``data/costmodels/*.json``."""
    return list(COST_MODELS) + sorted(p.stem for p in COST_MODEL_DIR.glob("*.json") if p.stem not in COST_MODELS)


def load_cost_model(spec: "str | Path | StepCostModel", relative_to: Optional[Path] = None) -> StepCostModel:
    """A cost model: ``spec`` itself when it is one (an engine model gets its prefill model resolved), a
    built-in name (:data:`~sdlib.sim.costmodel.COST_MODELS`), ``data/costmodels/<spec>.json``, or a JSON
    file. A relative path is taken from ``relative_to`` (default: the repo root; the CLI passes the folder
    the user stands in). Raises :class:`CostModelError`."""
    if isinstance(spec, StepCostModel):
        return _resolved(spec)
    if str(spec) in COST_MODELS:
        return COST_MODELS[str(spec)]
    p, d = _read(spec, relative_to)
    try:
        return _resolved(KINDS[d.get("kind", CostModel.kind)].from_dict(d))
    except (KeyError, TypeError, AttributeError) as e:
        raise CostModelError(f"{p}: not a cost model ({type(e).__name__}: {e})") from None


def kind_of(spec: "str | Path | StepCostModel", relative_to: Optional[Path] = None) -> str:
    """The kind of the model :func:`load_cost_model` would return for ``spec`` (without building it)."""
    if isinstance(spec, StepCostModel):
        return spec.kind
    if str(spec) in COST_MODELS:
        return COST_MODELS[str(spec)].kind
    return _read(spec, relative_to)[1].get("kind", CostModel.kind)


def _read(spec: "str | Path", relative_to: Optional[Path]) -> tuple[Path, dict]:
    """(file, its JSON) of a name under :data:`COST_MODEL_DIR` or a path (see :func:`load_cost_model`)."""
    s = str(spec)
    named = COST_MODEL_DIR / f"{s}.json"
    p = named if named.is_file() else (resolve(s) if relative_to is None else Path(relative_to) / Path(s).expanduser())
    if not p.is_file():
        raise CostModelError(f"{s!r} is neither a known model {cost_model_names()} nor a JSON file")
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CostModelError(f"{p}: not a cost model ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or d.get("kind", CostModel.kind) not in KINDS:
        raise CostModelError(f"{p}: not a cost model of a known kind {sorted(KINDS)}")
    return p, d


def _resolved(cm: StepCostModel) -> StepCostModel:
    """``cm`` with what it names resolved (an engine model's prefill model, from the repo root)."""
    if isinstance(cm, EngineCostModel) and cm.prefill is None:
        pre = load_cost_model(cm.prefill_model, relative_to=REPO_ROOT)
        if not isinstance(pre, CostModel):
            raise CostModelError(f"{cm.name}: prefill model {cm.prefill_model!r} is not a linear cost model")
        return cm.replace(prefill=pre)
    return cm


def find_cost_models(patterns: Iterable[str]) -> list[str]:
    """Cost-model JSON files matching repo-relative globs (e.g. ``data/costmodels/*.json``), sorted, each once."""
    return sorted({p for g in patterns for p in glob.glob(str(resolve(g)))})


def load_cost_models(paths: Iterable, first: Optional[CostModel] = AUTHORS_H100_LLAMA8B) -> list[CostModel]:
    """``first`` (the authors' fit by default; None: none) followed by the linear models in ``paths`` (names or
    files, :func:`load_cost_model`); models of another kind (an engine model: a table per path, k and batch
    size) are left out: the trace simulator of :mod:`sdlib.sim.oracle` prices linear models only."""
    return ([first] if first is not None else []) + [load_cost_model(p) for p in paths if kind_of(p) == CostModel.kind]
