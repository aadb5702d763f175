"""Shared test helpers: the test tiers (markers), and a fake engine that behaves like vLLM's LLMEngine with
DELTA outputs.

Tiers: unit tests (no marker) run anywhere; ``engine`` tests need the CPU build of vLLM and are skipped
without it; ``gpu`` tests need a CUDA GPU and vLLM; ``notebooks`` are the notebook runs (papermill in
``tests/test_notebooks_run.py``, or nbmake on ``notebooks/``), marked here at collection.
``pytest -m "not engine and not notebooks"`` is the fast tier.

Tests never write ``figures/``: ``SDLIB_FIGURES_DIR`` points at a temporary folder for the whole session
(``sdlib.plots.style``), and the notebook runs get their own ``FIGURES_DIR``.

Collection never imports vLLM (5-10 s): whether an ``engine`` test can run is decided when the first one is
set up. Each tier's summed durations are reported against its budget at the end (``tests/durations.py``).
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from sdlib.vllm.options import CPU_KV_ENV
from tests import durations

#: The CPU build's KV cache for the tests' engines, in GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``; a test or the caller
#: may set another). Unset, vLLM sizes it from ``gpu_memory_utilization`` x the node's memory (1.66 GiB at 0.1 on
#: the 23.5 GiB development machine, about 4 GiB at the 0.2 some tests use, more on a larger machine), after a
#: warm-up forward pass that an explicit size skips (vllm/v1/worker/cpu_worker.py). 1 GiB holds about 280,000 tokens
#: of the bf16 target (233,000 beside the draft model; half that in float32), where a test needs a few thousand; it
#: took two engine test files from 114 s to 88 s (2026-12-07). A smaller explicit size gained nothing more: with
#: 64 MiB (``engine.extra.kv_cache_memory_bytes``, the variable unset) test_engine's engines started in 18.5-20.7 s,
#: against 17.9-20.7 s at 1 GiB, two runs each (2026-12-07). Set here, before any test starts an engine process,
#: which inherits it; sdlib's preflight reads the same variable (sdlib.vllm.options.cpu_kv_budget_bytes).
TEST_CPU_KVCACHE_GIB = "1"
os.environ.setdefault(CPU_KV_ENV, TEST_CPU_KVCACHE_GIB)

#: Bootstrap replicates of the notebook runs inside the tests (a notebook with an ``N_BOOT`` parameter gets
#: this one; the tests recompute at the same value, so the identity checks stay exact). ``make notebooks``
#: uses each notebook's own default.
TEST_N_BOOT = 200


def pytest_addoption(parser):
    durations.addoption(parser)


def pytest_configure(config):
    """Send any figure a test (or a notebook it runs) saves to a temporary folder, never to figures/."""
    os.environ["SDLIB_FIGURES_DIR"] = tempfile.mkdtemp(prefix="sdlib-test-figures-")
    durations.configure(config)
    # pytest-xdist registers it when installed; the groups are harmless without it
    config.addinivalue_line("markers", "xdist_group(name): tests run in one pytest-xdist worker (--dist loadgroup)")


class NotebookRuns:
    """The notebook runs of ``make notebooks`` (:data:`sdlib.plots.notebooks.RUNS`), executed at most once
    per session with papermill into a temporary folder: executed copies in ``root``, figures and their
    CSVs in ``figures`` (one folder for all runs, as ``make notebooks`` uses ``figures/``). A notebook with
    an ``N_BOOT`` parameter runs with ``N_BOOT = n_boot`` (the tests recompute with the same)."""

    def __init__(self, root: Path, n_boot: int = TEST_N_BOOT):
        self.root = Path(root)
        self.figures = self.root / "figures"
        self.n_boot = n_boot
        self.done: dict[str, Path] = {}

    def run(self, name: str) -> Path:
        """Execute the run called ``name`` (a notebook stem or ``<stem>+<parameter file>``) once; its copy."""
        import dataclasses

        from sdlib.plots.notebooks import RUNS, execute

        if name not in self.done:
            run = next(r for r in RUNS if r.name == name)
            if "N_BOOT" in notebook_parameters(run.notebook):
                run = dataclasses.replace(run, parameters={**run.parameters, "N_BOOT": self.n_boot})
            self.done[name] = execute(run, self.root, self.figures)
        return self.done[name]

    def csv(self, name: str, file: str):
        """The table ``file`` (under the figures folder) after run ``name``."""
        import pandas as pd

        self.run(name)
        return pd.read_csv(self.figures / file)

    def run_all(self) -> Path:
        from sdlib.plots.notebooks import RUNS

        for r in RUNS:
            self.run(r.name)
        return self.figures


@pytest.fixture(scope="session")
def notebook_runs(tmp_path_factory) -> NotebookRuns:
    return NotebookRuns(tmp_path_factory.mktemp("notebook_runs"))


def run_input_cells(notebook: str, parameters: dict, figures_dir: Path) -> dict:
    """Run a notebook's cells in this process as papermill runs them, up to the one that checks its inputs:
    the cells before and including the ``parameters`` cell, then ``parameters`` and ``FIGURES_DIR =
    figures_dir`` (papermill's injected cell), then the next cell (each notebook reads and checks its inputs
    there, before anything is drawn). What a missing input raises there is raised here, with no kernel and
    no papermill run. Working directory and figures folder as papermill's (the repo root; restored after).
    Returns the notebook's namespace."""
    import nbformat

    from sdlib.paths import REPO_ROOT
    from sdlib.plots import style

    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    at = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    ns: dict = {"__name__": "__main__"}
    saved, cwd = style._figures_dir, os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        for i, cell in enumerate(code[:at + 2]):
            if i == at + 1:
                ns.update({**parameters, "FIGURES_DIR": str(figures_dir)})
            exec(compile(cell.source, f"<{notebook} code cell {i}>", "exec"), ns)  # noqa: S102
    finally:
        style._figures_dir = saved
        os.chdir(cwd)
    return ns


@functools.lru_cache(maxsize=None)
def notebook_parameters(notebook: str) -> dict:
    """The names in a notebook's ``parameters`` cell (papermill's own reading of it)."""
    import papermill as pm

    from sdlib.paths import REPO_ROOT

    return pm.inspect_notebook(str(REPO_ROOT / "notebooks" / f"{notebook}.ipynb"))


@functools.lru_cache(maxsize=1)
def vllm_importable() -> bool:
    """True when ``import vllm`` works here (the engine tier runs only then). Asked when the first engine or
    GPU test is set up, never at collection (the fast tier does not pay for the import)."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark notebook items ``notebooks`` (``engine`` and ``gpu`` items are skipped at set-up without vLLM or a
    GPU: :func:`pytest_runtest_setup`). For ``pytest -n 2 --dist loadgroup`` (``make test``), each item gets
    an ``xdist_group``: its module, or ``notebook_runs`` for every user of the session's notebook runs, so a
    module's fixtures and the notebook runs are made once, in one worker; and the groups are ordered longest
    first by their recorded durations (with ``--no-loadscope-reorder``, the workers take them in that order,
    so the last ones to run are short). It runs first: pytest-xdist's own hook turns the ``xdist_group`` markers
    into the node-id suffixes its scheduler groups by, and markers added after it are ignored (as they were
    until 2026-12-06: each test was then scheduled alone, and a module's fixtures were made in both workers)."""
    for item in items:
        uses_runs = "notebook_runs" in getattr(item, "fixturenames", ())
        if str(getattr(item, "path", "")).endswith(".ipynb") or uses_runs:
            item.add_marker(pytest.mark.notebooks)
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("notebook_runs" if uses_runs else item.nodeid.split("::")[0]))
    # in an xdist worker (where the order counts: the controller schedules the workers' collection) "dist" is
    # reset to "no" and "loadgroup" says what it was
    if config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False):
        items[:] = durations.longest_groups_first(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip ``gpu`` items without a CUDA GPU and vLLM, ``engine`` items without vLLM."""
    if "gpu" in item.keywords and not (cuda_available() and vllm_importable()):
        pytest.skip("needs a CUDA GPU and vLLM")
    elif "engine" in item.keywords and not vllm_importable():
        pytest.skip("vLLM is not installed (engine tier)")


@dataclass
class FakePrompt:
    index: int
    prompt_token_ids: list[int]
    max_output_tokens: int | None = None


@dataclass
class FakeEngine:
    """Each request follows a script: the list of token counts each step adds.

    ``scripts[prompt_len]`` -> gains per step (first = prefill). ``detailed[prompt_len]``
    -> (drafted, accepted) attached to the final output. Time advances 1.0 per step.
    """

    scripts: dict[int, list[int]]
    detailed: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    t: float = 0.0
    live: dict = field(default_factory=dict)
    added: list = field(default_factory=list)

    def clock(self) -> float:
        return self.t

    def add_request(self, rid, prompt, params):
        n = len(prompt["prompt_token_ids"])
        self.live[rid] = [n, list(self.scripts[n]), 0]
        self.added.append((self.t, rid))

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        self.t += 1.0
        outs = []
        for rid, st in list(self.live.items()):
            n, script, made = st
            g = script.pop(0)
            toks = list(range(made, made + g))
            st[2] += g
            fin = not script
            c = SimpleNamespace(token_ids=toks, finish_reason="length" if fin else None,
                                spec_decode_metrics=SimpleNamespace(
                                    per_step_drafted=self.detailed[n][0], per_step_accepted=self.detailed[n][1])
                                if (fin and n in self.detailed) else None)
            outs.append(SimpleNamespace(request_id=rid, outputs=[c], finished=fin))
            if fin:
                del self.live[rid]
        return outs


@pytest.fixture
def fake_engine():
    return FakeEngine


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child that a test sends SIGINT: a shell starts background jobs (``make test &``,
    ``nohup``) with SIGINT ignored, the child would inherit that and Python would then never raise
    KeyboardInterrupt; restore the default so the child meets Ctrl-C as at a terminal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def toy_cost_model():
    """The simulator tests' toy cost model: T(kv, n) = 1 + 0.1*n, EAGLE drafting 0.5 s, n-gram drafting 0.1*T,
    no overhead."""
    from sdlib.sim.costmodel import CostModel

    return CostModel(name="toy", target_kv_s=0.0, target_n_s=0.1, target_fixed_s=1.0, eagle_kv_s=0.0,
                     eagle_n_s=0.0, eagle_fixed_s=0.5, ngram_frac=0.1, overhead_s=0.0)


def toy_traces(rows):
    """rows: (dataset, id, prompt, output, acc_ngram, acc_eagle3) -> long-form traces (a row per method)."""
    import pandas as pd

    out = []
    for ds, rid, prompt, output, ng, eg in rows:
        for m, acc in (("ngram", ng), ("eagle3", eg)):
            out.append({"dataset": ds, "request_id": rid, "prompt_token_ids": prompt, "output_token_ids": output,
                        "method": m, "acc_len": acc})
    return pd.DataFrame(out)
