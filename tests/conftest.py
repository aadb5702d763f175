"""Shared test helpers: the test tiers (markers), and a fake engine that behaves like vLLM's LLMEngine with
DELTA outputs.

Tiers: unit tests (no marker) run anywhere; ``engine`` tests need the CPU build of vLLM and are skipped
without it; ``gpu`` tests need a CUDA GPU and vLLM; ``notebooks`` are the notebook runs (papermill in
``tests/test_notebooks_run.py``, or nbmake on ``notebooks/``), marked here at collection.
``pytest -m "not engine and not notebooks"`` is the fast tier.

Tests never write ``figures/``: ``SDLIB_FIGURES_DIR`` points at a temporary folder for the whole session
(``sdlib.plots.style``), and the notebook runs get their own ``FIGURES_DIR``.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest


def pytest_configure(config):
    """Send any figure a test (or a notebook it runs) saves to a temporary folder, never to figures/."""
    os.environ["SDLIB_FIGURES_DIR"] = tempfile.mkdtemp(prefix="sdlib-test-figures-")


class NotebookRuns:
    """The notebook runs of ``make notebooks`` (:data:`sdlib.plots.notebooks.RUNS`), executed at most once
    per session with papermill into a temporary folder: executed copies in ``root``, figures and their
    CSVs in ``figures`` (one folder for all runs, as ``make notebooks`` uses ``figures/``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.figures = self.root / "figures"
        self.done: dict[str, Path] = {}

    def run(self, name: str) -> Path:
        """Execute the run called ``name`` (a notebook stem or ``<stem>+<parameter file>``) once; its copy."""
        from sdlib.plots.notebooks import RUNS, execute

        if name not in self.done:
            run = next(r for r in RUNS if r.name == name)
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


@functools.lru_cache(maxsize=1)
def vllm_importable() -> bool:
    """True when ``import vllm`` works here (the engine tier runs only then)."""
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


def pytest_collection_modifyitems(config, items):
    """Mark notebook items ``notebooks``; skip ``engine`` items without vLLM and ``gpu`` items without a GPU."""
    for item in items:
        if str(getattr(item, "path", "")).endswith(".ipynb") or "notebook_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.notebooks)
        if "gpu" in item.keywords and not (cuda_available() and vllm_importable()):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and vLLM"))
        elif "engine" in item.keywords and not vllm_importable():
            item.add_marker(pytest.mark.skip(reason="vLLM is not installed (engine tier)"))


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
