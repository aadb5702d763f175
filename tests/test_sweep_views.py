"""Notebooks 01 and 02's pieces in sdlib: the roofline of a measured sweep (shape look-up, context, rates),
sweep discovery, a sweep's phase breakdown, the memory tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sdlib.analysis import breakdown as BD
from sdlib.analysis import memory as MEM
from sdlib.analysis.roofline import (decode_roofline, mean_context_tokens, measured_roofline, read_device_roofline,
                                     sweep_shape)
from sdlib.analysis.variance import existing_dirs
from sdlib.extract.tables import phases_frame
from sdlib.models.shapes import LLAMA_3_1_8B, kv_bytes_per_token, param_count
from sdlib.plots.throughput import batch_tick_labels, roofline_title
from sdlib.store.schema import columns, conform

DEVICE = {"device": "NVIDIA H200", "copy_bandwidth_gb_s": 4000.0, "bf16_matmul_tflop_s": 700.0}


def test_sweep_shape_from_the_first_model_path():
    prov = {"config": {"models": [{"path": "@shapes/llama-3.1-8b"}, {"path": "@shapes/qwen3-8b"}]}}
    assert sweep_shape(prov) is LLAMA_3_1_8B
    with pytest.raises(KeyError):
        sweep_shape({"config": {"models": [{"path": "@trained/target"}]}})


def test_mean_context_is_prompt_plus_half_the_output():
    req = pd.DataFrame({"prompt_tokens": [100, 300], "output_tokens": [50, 150]})
    assert mean_context_tokens(req) == (125 + 375) / 2


def test_decode_roofline_by_hand():
    # 1e9 params bf16 = 2e9 bytes; bs 2 at 1000 tokens x 1e5 B = 2e8 more; 1000 GB/s -> 2.2 ms per step
    r = decode_roofline(1e9, 1e5, 1000, [2], bandwidth_gb_s=1000, peak_tflop_s=100).iloc[0]
    assert r.memory_bound_tok_per_s == pytest.approx(2 / 2.2e-3)
    assert r.compute_bound_tok_per_s == pytest.approx(100e12 / 2e9)
    assert r.roofline_tok_per_s == pytest.approx(min(2 / 2.2e-3, 5e4))


def test_measured_roofline_fraction():
    tp_none = pd.DataFrame({"batch_size": [8, 1], "tok_per_s": [400.0, 60.0]})
    roof = measured_roofline(tp_none, LLAMA_3_1_8B, 500.0, DEVICE)
    assert roof.batch_size.tolist() == [1, 8]
    expect = decode_roofline(param_count(LLAMA_3_1_8B), kv_bytes_per_token(LLAMA_3_1_8B), 500.0, [1, 8], 4000.0, 700.0)
    assert roof.roofline_tok_per_s.tolist() == pytest.approx(expect.roofline_tok_per_s.tolist())
    assert roof.fraction_of_roofline.tolist() == pytest.approx([60.0 / expect.roofline_tok_per_s[0],
                                                                400.0 / expect.roofline_tok_per_s[1]])


def test_read_device_roofline_and_title(tmp_path):
    assert read_device_roofline(tmp_path) is None
    (tmp_path / "roofline.json").write_text(json.dumps(DEVICE))
    assert read_device_roofline(tmp_path) == DEVICE
    assert roofline_title(DEVICE) == "No-SD decode vs roofline (NVIDIA H200: 4000 GB/s copy, 700 TFLOP/s bf16)"


def test_existing_dirs_by_table(tmp_path, capsys):
    (tmp_path / "a" / "steps").mkdir(parents=True)
    (tmp_path / "b" / "runs").mkdir(parents=True)
    assert existing_dirs([tmp_path / "a", tmp_path / "b"]) == [tmp_path / "a", tmp_path / "b"]
    assert existing_dirs([tmp_path / "a", tmp_path / "b"], tables=("runs",)) == [tmp_path / "b"]
    assert str(tmp_path / "a") in capsys.readouterr().out


def write_phase_sweep(d):
    """Two runs (no SD, n-gram) with step_phases: step 4 s, verify 2 s, draft 1 s (n-gram), sample 0.5 s."""
    runs = pd.DataFrame({"run_id": ["base", "ng"], "model": "m", "method": ["none", "ngram"],
                         "method_label": ["none", "ngram-k3"], "dataset": "d", "batch_size": 1, "status": "ok"})
    (d / "runs").mkdir(parents=True)
    (d / "step_phases").mkdir()
    conform("runs", runs.reindex(columns=columns("runs"))).to_parquet(d / "runs" / "all.parquet", index=False)
    for rid, draft in (("base", 0.0), ("ng", 1.0)):
        rows = [{"phase": p, "calls": 2, "total_s": s, "timer": "perf_counter"}
                for p, s in (("step", 4.0), ("verify", 2.0), ("draft", draft), ("sample", 0.5))]
        phases_frame(rid, rows).to_parquet(d / "step_phases" / f"{rid}.parquet", index=False)


def test_sweep_breakdown(tmp_path):
    assert BD.sweep_breakdown(tmp_path) is None  # no step_phases: None, not an empty table
    write_phase_sweep(tmp_path / "sw")
    bt = BD.sweep_breakdown(tmp_path / "sw").set_index("method")
    assert sorted(bt.index) == ["ngram", "none"]
    assert bt.loc["ngram", "share_draft"] == 0.25 and bt.loc["ngram", "other_s"] == 0.5
    assert bt.loc["none", "share_other"] == 1.5 / 4
    only_sd = BD.sweep_breakdown(tmp_path / "sw", include_no_sd=False)
    assert only_sd.method.tolist() == ["ngram"]


def test_memory_tables_keys_and_titles(tmp_path, capsys):
    t = MEM.memory_tables(paper_shapes=True, embedded=False)
    assert list(t) == ["paper_shapes"]
    mt, what = t["paper_shapes"]
    assert what == MEM.MEMORY_TABLES["paper_shapes"]
    assert mt.equals(MEM.memory_table(MEM.paper_setups()))
    assert MEM.memory_tables(paper_shapes=False, embedded=True, models_dir=tmp_path) == {}
    assert "no embedded models" in capsys.readouterr().out


def test_batch_tick_labels_set_a_threshold_s_two_sides_on_two_lines():
    assert batch_tick_labels([48, 63, 64, 96]) == ["48", "63", "\n64", "96"]
    assert batch_tick_labels([1, 2, 4, 8, 16, 32, 64, 128]) == ["1", "2", "4", "8", "16", "32", "64", "128"]
