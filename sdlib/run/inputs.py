"""The files a sweep's workloads read, fingerprinted, so that cells run on one content of a file are never
mixed with cells run on another.

A cell's run id hashes its workload's settings, among them a trace or prompt file's *path*, not the file's
content (the committed run ids stay as they are). A trace file regenerated in place would therefore leave the
cells run on the old traces looking done, and a resumed sweep would mix them with cells of the new ones. So
each invocation that runs cells records ``{file: sha256[:12]}`` of every file its workloads read (provenance
``inputs``), and every invocation first checks the record: a file whose content changed while done cells of
the current config read it is a :class:`~sdlib.config.ConfigError` naming the file, its two fingerprints and
how many done cells read it.

Files a workload reads: its ``path`` (source ``traces``, ``local``, or ``auto`` where that file exists; a glob
reads every match) and, for source ``reference``, the authors' trace file of its dataset. What a replayed
policy decides from besides the traces (predictor, confidences, cost model) is hashed into the run id already
(:func:`sdlib.sim.replay.replay_inputs`).

Usage:
    from sdlib.run.inputs import check_inputs, record_inputs
    fps = check_inputs(sweep, store)        # raises ConfigError on a changed file that done cells read
    record_inputs(store, fps)               # when this invocation runs cells
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Optional

from sdlib.config import ConfigError, SweepConfig, WorkloadConfig, file_fingerprint
from sdlib.paths import repo_relative, resolve
from sdlib.sim.traces import REFERENCE_FILES, reference_path
from sdlib.store import SweepStore

#: The provenance key of the record.
INPUTS_KEY = "inputs"


def workload_files(w: WorkloadConfig) -> list[str]:
    """The files ``w`` reads (repo-relative where they lie in the checkout), sorted."""
    out: list[Path] = []
    if w.source == "reference" and w.dataset in REFERENCE_FILES:
        out = [p for p in [reference_path(w.dataset)] if p.exists()]
    elif w.path and w.source in ("traces", "local", "auto"):
        out = [Path(p) for p in glob.glob(str(resolve(w.path)))]
    return sorted({repo_relative(p) for p in out})


def input_fingerprints(sweep: SweepConfig) -> dict[str, Optional[str]]:
    """``{file: sha256[:12]}`` of every file the sweep's workloads read (None: missing)."""
    files = sorted({f for w in sweep.workloads for f in workload_files(w)})
    return {f: file_fingerprint(str(resolve(f))) for f in files}


def check_inputs(sweep: SweepConfig, store: SweepStore) -> dict[str, Optional[str]]:
    """Today's :func:`input_fingerprints`, after checking them against the store's record: a recorded file whose
    content has changed while done cells of the current config read it is a ConfigError."""
    now = input_fingerprints(sweep)
    recorded = store.read_provenance().get(INPUTS_KEY) or {}
    changed = {f: (recorded[f], fp) for f, fp in now.items() if f in recorded and fp and recorded[f] != fp}
    if changed:
        done = store.done_ids()
        files = {w.label: workload_files(w) for w in sweep.workloads}
        for f, (old, new) in changed.items():
            n = sum(1 for c in sweep.cells() if c.run_id in done and f in files[c.workload.label])
            if n:
                raise ConfigError(f"{f} changed since {n} done cell(s) of this sweep read it (sha256 {old} -> {new}): "
                                  f"restore it, or run into a new --results-dir ({store.dir})")
    return now


def record_inputs(store: SweepStore, fingerprints: dict[str, Optional[str]]) -> None:
    """Record ``fingerprints`` (provenance ``inputs``, merged over earlier records; missing files are not
    recorded); writes nothing when the record already says so."""
    prov = store.read_provenance()
    merged = {**(prov.get(INPUTS_KEY) or {}), **{f: fp for f, fp in fingerprints.items() if fp}}
    if merged != (prov.get(INPUTS_KEY) or {}):
        store.set_provenance_key(INPUTS_KEY, dict(sorted(merged.items())))


__all__ = ["INPUTS_KEY", "check_inputs", "input_fingerprints", "record_inputs", "workload_files"]
