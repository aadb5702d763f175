"""Every notebook run that writes ``figures/``: each notebook with its defaults (the embedded data), plus
the parameter files that draw the committed GPU sweeps. ``make notebooks`` runs them all; the tests run
the same list into a temporary folder and check that nothing under ``figures/`` lacks a producer.

Usage:
    python -m sdlib.plots.notebooks                      # all runs -> figures/, executed copies -> build/notebooks
    python -m sdlib.plots.notebooks --figures-dir /tmp/f --only 01_throughput_sweep
    from sdlib.plots.notebooks import RUNS, execute
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from sdlib.paths import REPO_ROOT, resolve


@dataclass(frozen=True)
class NotebookRun:
    """One papermill run: a notebook (stem under ``notebooks/``), an optional parameter file under
    ``configs/``, and extra parameters."""

    notebook: str
    parameters_file: Optional[str] = None
    parameters: dict = field(default_factory=dict, hash=False)

    @property
    def name(self) -> str:
        """``01_throughput_sweep`` or ``01_throughput_sweep+gpu_sweeps`` (the executed copy's stem)."""
        if self.parameters_file is None:
            return self.notebook
        return f"{self.notebook}+{Path(self.parameters_file).name.split('.')[0]}"

    @property
    def path(self) -> Path:
        return REPO_ROOT / "notebooks" / f"{self.notebook}.ipynb"


GPU_SWEEPS = "configs/gpu_sweeps.papermill.yaml"
GPU_VERSIONS = "configs/gpu_versions.papermill.yaml"
H200_V034_SERVING = "configs/h200_v034_serving.papermill.yaml"
GPU_AV_PHASES = "configs/gpu_av_phases.papermill.yaml"

#: The runs, in order (notebook 05 reads data/costmodels/, written by ``make costmodels``).
RUNS = [
    NotebookRun("01_throughput_sweep"),
    NotebookRun("01_throughput_sweep", GPU_SWEEPS),
    NotebookRun("01_throughput_sweep", GPU_VERSIONS),
    NotebookRun("02_time_breakdown"),
    NotebookRun("02_time_breakdown", GPU_SWEEPS),
    NotebookRun("02_time_breakdown", GPU_AV_PHASES),
    NotebookRun("03_acceptance_variance"),
    NotebookRun("04_bleu_ngram"),
    NotebookRun("05_oracle_bounds"),
    NotebookRun("06_trace_replay"),
    NotebookRun("07_online_policy"),
    NotebookRun("08_serving"),
    NotebookRun("08_serving", H200_V034_SERVING),
]


def run_parameters(run: NotebookRun, figures_dir: Optional[str | Path] = None) -> dict:
    """The parameters papermill gets: the parameter file's, then ``run.parameters``, then ``FIGURES_DIR``."""

    params = {}
    if run.parameters_file:
        params.update(yaml.safe_load(resolve(run.parameters_file).read_text()) or {})
    params.update(run.parameters)
    if figures_dir is not None:
        params["FIGURES_DIR"] = str(figures_dir)
    return params


def execute(run: NotebookRun, out_dir: str | Path, figures_dir: Optional[str | Path] = None,
            progress: bool = False) -> Path:
    """Execute ``run`` with papermill (kernel ``python3``, working directory the repo root); the executed
    copy goes to ``out_dir/<run.name>.ipynb``; figures to ``figures_dir`` (None: the notebook's default)."""
    # deferred: papermill is slow to import, and only this path needs it
    import papermill as pm

    out = Path(out_dir) / f"{run.name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(str(run.path), str(out), parameters=run_parameters(run, figures_dir), kernel_name="python3",
                        progress_bar=progress, cwd=str(REPO_ROOT), kernel_manager_class=ipc_kernel_manager())
    return out


def ipc_kernel_manager():
    """A Jupyter kernel manager that talks to its kernel over local (IPC) sockets in a private temporary
    folder, not TCP: nothing listens on the network, and the kernel does not warn "Kernel is running over TCP
    without encryption" once per notebook."""

    # deferred: jupyter_client is slow to import, and only this path needs it
    from jupyter_client.manager import KernelManager
    from traitlets import CaselessStrEnum, default

    class IPCKernelManager(KernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc", config=True)

        @default("ip")
        def _ip_default(self) -> str:
            return str(Path(tempfile.mkdtemp(prefix="sdlib-kernel-")) / "kernel")

        def cleanup_ipc_files(self) -> None:
            super().cleanup_ipc_files()
            try:
                Path(self.ip).parent.rmdir()  # the private folder, once its sockets are gone
            except OSError:
                pass

    return IPCKernelManager


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sdlib.plots.notebooks",
                                 description="Execute every notebook run that writes figures/ (papermill).")
    ap.add_argument("--out", default="build/notebooks", help="folder for the executed copies (default build/notebooks)")
    ap.add_argument("--figures-dir", default=None, help="write figures here instead of the notebooks' default")
    ap.add_argument("--only", action="append", default=[], help="run only these (notebook stem or run name); repeatable")
    a = ap.parse_args(argv)
    runs = [r for r in RUNS if not a.only or r.notebook in a.only or r.name in a.only]
    if not runs:
        ap.error(f"--only {a.only}: no such run; runs: {[r.name for r in RUNS]}")
    for r in runs:
        print(f"== papermill {r.path.relative_to(REPO_ROOT)}" + (f" -f {r.parameters_file}" if r.parameters_file else ""),
              flush=True)
        execute(r, Path(a.out).resolve(), Path(a.figures_dir).resolve() if a.figures_dir else None, progress=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
