"""Notebook 08's recorded numbers against a recomputation from the committed serving tables through sdlib;
the committed serving sweep is complete for its config; the figures' titles carry provenance."""

from __future__ import annotations

import ast
import json

import pandas as pd
import pytest

from sdlib.analysis import serving as M
from sdlib.paths import CONFIGS_DIR, FIGURES_DIR, REPO_ROOT
from sdlib.serve.config import load_serving
from sdlib.store.serving_store import ServingStore

NB = REPO_ROOT / "notebooks" / "08_serving.ipynb"


def _defaults() -> dict:
    """The notebook's parameters cell, evaluated (literals only)."""
    cells = json.loads(NB.read_text())["cells"]
    src = "".join(next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))["source"])
    return {t.id: ast.literal_eval(n.value) for n in ast.parse(src).body for t in n.targets}


#: the notebook runs that draw a committed serving sweep: its defaults (the CPU build) and the H200 sweep on
#: vLLM 0.34 (sdlib/plots/notebooks.py lists both), with what each figure title must say
RUNS = {
    "embedded": (None, ("tiny-target", "trained", "real acceptance", "vLLM 0.32", "Poisson")),
    "h200_v034": ("h200_v034_serving.papermill.yaml",
                  ("llama-3.1-8b", "dummy weights", "synthetic acceptance", "NVIDIA H200", "vLLM 0.34.0", "Poisson")),
}


def _parameters(run: str) -> dict:
    """The notebook's defaults updated with what the run passes (sdlib.plots.notebooks.run_parameters)."""
    from sdlib.plots.notebooks import NotebookRun, run_parameters

    file = RUNS[run][0]
    return {**_defaults(), **run_parameters(NotebookRun("08_serving", f"configs/{file}" if file else None))}


@pytest.fixture(scope="module", params=sorted(RUNS))
def committed(request):
    p = _parameters(request.param)
    cfg = load_serving(p["SERVING_CONFIG"])
    store = ServingStore(cfg.out_dir)
    if not store.done_ids():
        pytest.skip("no committed serving tables")
    return p, cfg, store, M.read_serving(store, cfg.run_ids()), RUNS[request.param][1]


def test_committed_serving_sweep_is_complete(committed):
    _, cfg, store, t, _ = committed
    assert set(t["serve_runs"]["run_id"]) == cfg.run_ids(), f"rerun `sdlib serve` on {cfg.name}'s config"
    assert store.failures().empty
    runs = t["serve_runs"]
    # every request completed, and the client kept the schedule: sent rate within 5% of the requested rate
    assert (runs["completed"] == runs["num_requests"]).all() and (runs["failed"] == 0).all()
    assert ((runs["sent_rate_rps"] / runs["rate_rps"] - 1).abs() < 0.05).all()


def test_summary_percentiles_equal_a_recomputation_from_the_request_tables(committed):
    """What the sweep wrote per cell (serve_runs) against :func:`summarize` of that cell's own per-request
    and per-message tables: the GPU sweep's numbers are checked as the CPU engine test checks its own."""
    _, _, _, t, _ = committed
    runs, req, ch = t["serve_runs"], t["serve_requests"], t["serve_chunks"]
    for r in runs.itertuples():
        s = M.summarize(req[req.run_id == r.run_id], ch[ch.run_id == r.run_id])
        assert s and "ttft_p99_s" in s and "itl_p50_s" in s
        for k, v in s.items():
            got = getattr(r, k)
            assert (pd.isna(got) and pd.isna(v)) or got == pytest.approx(v, rel=1e-9), (r.run_id, k, got, v)


def test_decision_table_csv_is_recomputed_from_the_tables(committed):
    p, cfg, store, t, _ = committed
    f = FIGURES_DIR / f"08_serving__decision__serving={cfg.name}.csv"
    if not f.exists():
        pytest.skip("run the notebook first")
    runs, req, ch = t["serve_runs"], t["serve_requests"], t["serve_chunks"]
    sla = M.SLA(p["SLA_TTFT_MS"], p["SLA_ITL_MS"], p["SLA_PERCENTILE"])
    fleets = runs[runs.kind == "fleet"]
    iv = M.latency_intervals(fleets, req, ch, metrics=("ttft", "itl"), percentiles=(sla.percentile,),
                             n_boot=p["N_BOOT"])
    sl = M.sla_table(iv, sla)
    cap = M.capacity_table(fleets, sl, M.goodput_table(fleets, req, sla), p["NODE_PRICE_PER_HOUR"])
    dec = M.decision_table(cap, sl, cfg.fleet_descriptions(), p["NODE_PRICE_PER_HOUR"], sla).set_index("fleet")
    csv = pd.read_csv(f).set_index("fleet")
    assert set(csv.index) == set(dec.index) == {f.name for f in cfg.fleets}
    for col in ("max_rate_meeting_sla_rps", "output_tok_per_s", "cost_per_m_output_tokens",
                f"ttft_p{sla.percentile:g}_ms", f"itl_p{sla.percentile:g}_ms"):
        pd.testing.assert_series_equal(csv[col].astype(float), dec[col].astype(float), check_names=False,
                                       rtol=1e-6)


def test_latency_csv_estimates_equal_the_summaries(committed):
    _, cfg, _, t, _ = committed
    f = FIGURES_DIR / f"08_serving__latency__serving={cfg.name}.csv"
    if not f.exists():
        pytest.skip("run the notebook first")
    iv = pd.read_csv(f)
    runs = t["serve_runs"].set_index("run_id")
    for r in iv.itertuples():  # the point estimates are the percentiles the sweep wrote
        assert r.value_s == pytest.approx(runs.loc[r.run_id, f"{r.metric}_p{r.percentile:g}_s"], rel=1e-9)


def test_serving_title_names_models_device_and_vllm(committed):
    from sdlib.plots.serving import serving_title

    _, cfg, store, _, says = committed
    title = serving_title(store, "x")
    for s in (cfg.name, *says):
        assert s in title, (s, title)
    assert title.count("dummy weights") <= 1, title


@pytest.mark.parametrize("name", ["h200_serving.papermill.yaml", "h200_v034_serving.papermill.yaml"])
def test_papermill_file_names_the_serving_config(name):
    import yaml

    p = yaml.safe_load((CONFIGS_DIR / name).read_text())
    assert set(p) <= set(_defaults()), "papermill parameters must be the notebook's"
    load_serving(p["SERVING_CONFIG"])
