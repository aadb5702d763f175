"""The same cells on two vLLM versions: does each engine finding still hold on the newer engine?

Two sweeps of one design on one GPU (e.g. ``data/sweeps/h200_llama8b`` on vLLM 0.26 and
``data/sweeps/h200_v034_llama8b`` on 0.34) are joined on the cells both ran, and each side's measured ratio is
classed by its own interval: ``faster`` (the interval lies above 1), ``slower`` (below 1) or ``not established``
(it contains 1). A finding **holds** on the newer engine when both sides fall in the same class; ``changed``
when they fall in opposite established classes; otherwise it is ``not established`` on one side, and says so.
The two intervals come from different engines and days, so no ratio between versions is formed: each side's
interval is its own, as its notebook computes it.

* :func:`synthetic_versions`: paper-shape sweeps (synthetic acceptance): every SD cell's speedup over the no-SD
  cell with its interval, as notebook 01 computes them (:func:`sdlib.analysis.intervals.sweep_intervals`).
* :func:`powered_versions`: powered replay sweeps (:func:`sdlib.analysis.powered.powered_tables`): each arm over
  no SD and each headline comparison (policy over the best fixed k), with the sides' A/A checks.
* :func:`powered_graph_modes`: the same comparison between one powered design's arms under vLLM's default CUDA
  graphs and under FULL graphs (:func:`powered_pair` is what both share).

Usage:
    from sdlib.analysis.versions import synthetic_versions
    t = synthetic_versions("data/sweeps/h200_llama8b", "data/sweeps/h200_v034_llama8b")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sdlib.analysis.powered import arm_info, powered_tables
from sdlib.analysis.intervals import sweep_intervals
from sdlib.analysis.replay import graph_mode
from sdlib.core import bootstrap
from sdlib.store import SweepStore

#: How a side's interval classes its ratio.
FASTER, SLOWER, UNSURE = "faster", "slower", "not established"
#: How the two sides compare.
HOLDS, CHANGED = "holds", "changed"


def verdict(lo: float, hi: float, drift: float = 0.0) -> str:
    """``faster`` when the interval lies above 1 + ``drift`` (a powered block's A/A drift; 0 where there is
    none), ``slower`` below 1 - ``drift``, else ``not established``."""
    if lo > 1 + drift:
        return FASTER
    if hi < 1 - drift:
        return SLOWER
    return UNSURE


def compare_verdicts(old: str, new: str) -> str:
    """``holds`` (same established class), ``changed`` (opposite established classes) or ``not established``."""
    if old == new and old != UNSURE:
        return HOLDS
    if UNSURE in (old, new):
        return UNSURE
    return CHANGED


def vllm_version(sweep_dir: str | Path) -> str:
    """The vLLM version(s) the sweep's engines reported (its provenance), e.g. ``0.26.0``; several joined by ``+``."""
    prov = SweepStore(sweep_dir).read_provenance()
    seen = {e.get("vllm_version") for inv in prov.get("invocations", []) for e in inv.get("engines", [])}
    return "+".join(sorted(v for v in seen if v)) or "?"


def _sides(old: pd.DataFrame, new: pd.DataFrame, keys: list[str], value: str, lo: str, hi: str,
           old_name: str, new_name: str) -> pd.DataFrame:
    cols = keys + [value, lo, hi]
    m = old[cols].merge(new[cols], on=keys, suffixes=(f"_{old_name}", f"_{new_name}"))
    for side in (old_name, new_name):
        m[f"verdict_{side}"] = [verdict(a, b) for a, b in zip(m[f"{lo}_{side}"], m[f"{hi}_{side}"])]
    m["finding"] = [compare_verdicts(a, b) for a, b in zip(m[f"verdict_{old_name}"], m[f"verdict_{new_name}"])]
    return m


def synthetic_versions(old_dir: str | Path, new_dir: str | Path, n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per SD cell both sweeps ran (model, dataset, batch size, batch mode, method label): each version's
    speedup over no SD with its interval (the values of each sweep's own speedup table in notebook 01), its
    verdict, and whether the finding holds. Columns are suffixed ``old`` and ``new`` (``version_old`` and
    ``version_new`` name the vLLM versions)."""
    keys = ["model", "dataset", "batch_size", "batch_mode", "method", "method_label", "num_spec_tokens"]
    old, new = (sweep_intervals(d, n_boot=n_boot)[1] for d in (old_dir, new_dir))
    old, new = (d[d["method"] != "none"] for d in (old, new))
    m = _sides(old, new, keys, "speedup", "speedup_lo", "speedup_hi", "old", "new")
    m.insert(0, "version_old", vllm_version(old_dir))
    m.insert(1, "version_new", vllm_version(new_dir))
    return m.sort_values(["method_label", "batch_size"]).reset_index(drop=True)


def synthetic_long(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`synthetic_versions`' rows as one row per version and cell, ``method_label`` suffixed with the
    version (``eagle3-k3-L2.5, vLLM 0.34.0``): the form :func:`sdlib.plots.throughput.plot_speedup` draws."""
    keep = ["model", "dataset", "batch_size", "method", "method_label"]
    sides = []
    for side in ("old", "new"):
        d = t[keep + [f"speedup_{side}", f"speedup_lo_{side}", f"speedup_hi_{side}"]].rename(
            columns={f"speedup_{side}": "speedup", f"speedup_lo_{side}": "speedup_lo", f"speedup_hi_{side}": "speedup_hi"})
        sides.append(d.assign(version=t[f"version_{side}"],
                              method_label=d["method_label"] + ", vLLM " + t[f"version_{side}"]))
    return pd.concat(sides, ignore_index=True)


def arm_policies(provenance: dict) -> dict[str, str]:
    """Per method label of a powered sweep: the policy it replays, from its config (``none`` for no SD; an A/A
    twin's with ``-AA``), so that two versions' configs compare by policy, not by the engine's K, which they may
    set differently (0.34 verifies K on every row, so fixed k runs on an engine of K = k)."""
    out = {}
    for m in arm_info(provenance).itertuples():
        pol = m.replay if isinstance(m.replay, str) and m.replay else ("none" if m.family == "none" else m.method_label)
        out[m.method_label] = f"{pol}-AA" if isinstance(m.aa_of, str) and m.aa_of else pol
    return out


def _comparison_key(df: pd.DataFrame, policies: dict[str, str]) -> pd.DataFrame:
    """``df`` with ``arm_policy`` and ``reference_policy``: its labels' policies (:func:`arm_policies`)."""
    return df.assign(arm_policy=df["arm"].map(policies), reference_policy=df["reference"].map(policies))


def powered_pair(a_dir: str | Path, b_dir: str | Path, sides: tuple[str, str] = ("old", "new"),
                 n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """Per (dataset, batch size, arm policy, reference policy) both powered sweeps compared: every arm over no
    SD and every headline comparison (over the best fixed k), each side's ratio with its interval, its A/A check
    (``aa_ok``) and drift (``aa_drift``: its verdict needs the interval to clear 1 by more), its verdict and whether
    the finding holds. Columns are suffixed with ``sides`` (``a_dir``'s name first). A side whose A/A check fails
    has its verdict set to ``not established`` (its intervals are not to be believed). No ratio between the two
    sweeps is formed: they ran at other engine starts, on other machines or days. A sweep with no complete block
    yet gives no rows (an empty frame); a folder that is not there is an error. A key that names two arms of one
    sweep (one policy on two engines) is an error rather than a silent cross join."""
    a, b = sides
    keys = ["dataset", "batch_size", "kind", "arm_policy", "reference_policy"]
    extra = ["arm", "reference", "aa_ok", "aa_drift", "n_prompts", "n_starts", "n_cells"]
    cols = keys + ["ratio", "ratio_lo", "ratio_hi"] + extra
    frames = []
    for d in (a_dir, b_dir):
        t = powered_tables(d, n_boot=n_boot)
        if t["units"].empty:  # no block has every arm at every engine start and repeat yet: no rows
            frames.append(pd.DataFrame(columns=cols))
            continue
        rows = pd.concat([t["speedups"].assign(kind="over no SD"), t["headline"].assign(kind="over best fixed")])
        frames.append(_comparison_key(rows, arm_policies(SweepStore(d).read_provenance())).dropna(subset=keys))
    left, right = (f[cols] for f in frames)
    m = left.merge(right, on=keys, suffixes=(f"_{a}", f"_{b}"), validate="one_to_one")
    for side in sides:
        bounds = zip(m[f"ratio_lo_{side}"], m[f"ratio_hi_{side}"], m[f"aa_drift_{side}"])
        v = [verdict(lo, hi, d) for lo, hi, d in bounds]
        m[f"verdict_{side}"] = np.where(m[f"aa_ok_{side}"].astype(bool), v, UNSURE)
    m["finding"] = [compare_verdicts(x, y) for x, y in zip(m[f"verdict_{a}"], m[f"verdict_{b}"])]
    return m.sort_values(keys).reset_index(drop=True)


def _in_front(m: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``m`` with a constant column per entry of ``columns`` inserted before its own, in order."""
    for i, (name, value) in enumerate(columns.items()):
        m.insert(i, name, value)
    return m


def powered_versions(old_dir: str | Path, new_dir: str | Path, n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """:func:`powered_pair` of one powered design on an older and a newer vLLM (sides ``old`` and ``new``;
    ``version_old`` and ``version_new`` name the versions)."""
    m = powered_pair(old_dir, new_dir, ("old", "new"), n_boot=n_boot)
    return _in_front(m, {"version_old": vllm_version(old_dir), "version_new": vllm_version(new_dir)})


def powered_graph_modes(default_dir: str | Path, full_dir: str | Path,
                        n_boot: int = bootstrap.N_BOOT) -> pd.DataFrame:
    """:func:`powered_pair` of the same arms under vLLM's default CUDA graphs and under FULL graphs (sides
    ``default`` and ``full``; ``graph_mode_<side>`` is each sweep's mode as its config asks for it,
    :func:`sdlib.analysis.replay.graph_mode`, not what vLLM's engine logs say it captured, and ``version_<side>``
    its vLLM). Only what both sweeps ran is joined: the rows over no SD of the arms both have, and a headline
    comparison only where both sweeps' best fixed arm is the same policy."""
    m = powered_pair(default_dir, full_dir, ("default", "full"), n_boot=n_boot)
    front = {}
    for side, d in (("default", default_dir), ("full", full_dir)):
        front[f"graph_mode_{side}"] = graph_mode(SweepStore(d).read_provenance())
        front[f"version_{side}"] = vllm_version(d)
    return _in_front(m, front)
