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


@pytest.fixture(scope="module")
def committed():
    p = _defaults()
    cfg = load_serving(p["SERVING_CONFIG"])
    store = ServingStore(cfg.out_dir)
    if not store.done_ids():
        pytest.skip("no committed serving tables")
    return p, cfg, store, M.read_serving(store, cfg.run_ids())


def test_committed_serving_sweep_is_complete(committed):
    _, cfg, store, t = committed
    assert set(t["serve_runs"]["run_id"]) == cfg.run_ids(), "rerun `sdlib serve configs/embedded_serving.yaml`"
    assert store.failures().empty
    runs = t["serve_runs"]
    # the client kept the schedule: sent rate within 5% of the requested rate in every cell
    assert ((runs["sent_rate_rps"] / runs["rate_rps"] - 1).abs() < 0.05).all()


def test_decision_table_csv_is_recomputed_from_the_tables(committed):
    p, cfg, store, t = committed
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
    _, cfg, _, t = committed
    f = FIGURES_DIR / f"08_serving__latency__serving={cfg.name}.csv"
    if not f.exists():
        pytest.skip("run the notebook first")
    iv = pd.read_csv(f)
    runs = t["serve_runs"].set_index("run_id")
    for r in iv.itertuples():  # the point estimates are the percentiles the sweep wrote
        assert r.value_s == pytest.approx(runs.loc[r.run_id, f"{r.metric}_p{r.percentile:g}_s"], rel=1e-9)


def test_serving_title_names_models_device_and_vllm(committed):
    from sdlib.plots.serving import serving_title

    _, cfg, store, _ = committed
    title = serving_title(store, "x")
    for s in (cfg.name, "tiny-target", "trained", "real acceptance", "vLLM 0.32", "Poisson"):
        assert s in title, (s, title)


def test_papermill_file_names_the_serving_config():
    import yaml

    p = yaml.safe_load((CONFIGS_DIR / "h200_serving.papermill.yaml").read_text())
    assert set(p) <= set(_defaults()), "papermill parameters must be the notebook's"
    load_serving(p["SERVING_CONFIG"])
