"""sdlib.analysis.versions: each side's verdict from its own interval, and whether a finding holds."""

import pandas as pd
import pytest

from sdlib.analysis import versions as v


@pytest.mark.parametrize("lo,hi,want", [(1.01, 1.2, v.FASTER), (0.8, 0.99, v.SLOWER), (0.9, 1.1, v.UNSURE),
                                        (1.0, 1.1, v.UNSURE)])
def test_verdict_is_the_side_of_1_the_interval_lies_on(lo, hi, want):
    assert v.verdict(lo, hi) == want


@pytest.mark.parametrize("old,new,want", [(v.FASTER, v.FASTER, v.HOLDS), (v.SLOWER, v.SLOWER, v.HOLDS),
                                          (v.FASTER, v.SLOWER, v.CHANGED), (v.SLOWER, v.FASTER, v.CHANGED),
                                          (v.FASTER, v.UNSURE, v.UNSURE), (v.UNSURE, v.UNSURE, v.UNSURE)])
def test_a_finding_holds_only_when_both_sides_establish_the_same_direction(old, new, want):
    assert v.compare_verdicts(old, new) == want


def test_sides_join_on_shared_cells_only_and_class_each_side_by_its_own_interval():
    keys = ["dataset", "batch_size"]
    old = pd.DataFrame({"dataset": ["a", "a", "b"], "batch_size": [1, 32, 1], "r": [1.5, 0.9, 1.0],
                        "lo": [1.2, 0.85, 0.9], "hi": [1.8, 0.95, 1.1]})
    new = pd.DataFrame({"dataset": ["a", "a", "c"], "batch_size": [1, 32, 1], "r": [1.4, 1.1, 1.0],
                        "lo": [1.1, 1.05, 0.9], "hi": [1.7, 1.2, 1.1]})
    m = v._sides(old, new, keys, "r", "lo", "hi", "old", "new")
    assert m[keys].values.tolist() == [["a", 1], ["a", 32]]
    assert m["finding"].tolist() == [v.HOLDS, v.CHANGED]


def test_replay_labels_compare_by_policy_not_by_engine_k():
    df = pd.DataFrame({"arm": ["ngram-k10-fixed-ngram-k3", "ngram-k3-fixed-ngram-k3-AA", "none"],
                       "reference": ["none", "ngram-k3-fixed-ngram-k3", "none"]})
    prov = {"config": {"methods": [
        {"name": "ngram", "num_spec_tokens": 10, "replay": "fixed-ngram-k3", "label": "ngram-k10-fixed-ngram-k3"},
        {"name": "ngram", "num_spec_tokens": 3, "replay": "fixed-ngram-k3", "label": "ngram-k3-fixed-ngram-k3"},
        {"name": "ngram", "num_spec_tokens": 3, "replay": "fixed-ngram-k3", "label": "ngram-k3-fixed-ngram-k3-AA",
         "aa_of": "ngram-k3-fixed-ngram-k3"},
        {"name": "none", "label": "none"}]}}
    k = v._comparison_key(df, v.arm_policies(prov))
    assert k["arm_policy"].tolist() == ["fixed-ngram-k3", "fixed-ngram-k3-AA", "none"]
    assert k["reference_policy"].tolist() == ["none", "fixed-ngram-k3", "none"]


def test_long_form_has_one_row_per_version_and_cell_with_its_own_interval():
    t = pd.DataFrame({"model": ["m"], "dataset": ["d"], "batch_size": [32], "method": ["ngram"],
                      "method_label": ["ngram-k3"], "version_old": ["0.26.0"], "version_new": ["0.34.0"],
                      "speedup_old": [1.1], "speedup_lo_old": [1.0], "speedup_hi_old": [1.2],
                      "speedup_new": [2.0], "speedup_lo_new": [1.9], "speedup_hi_new": [2.1]})
    long = v.synthetic_long(t)
    assert long["method_label"].tolist() == ["ngram-k3, vLLM 0.26.0", "ngram-k3, vLLM 0.34.0"]
    assert long[["speedup", "speedup_lo", "speedup_hi"]].values.tolist() == [[1.1, 1.0, 1.2], [2.0, 1.9, 2.1]]


def test_a_sweep_against_itself_holds_wherever_it_is_established():
    from sdlib.paths import REPO_ROOT

    d = REPO_ROOT / "data" / "sweeps" / "embedded_default"
    t = v.synthetic_versions(d, d, n_boot=200)
    assert len(t) and (t["speedup_old"] == t["speedup_new"]).all()
    assert (t["finding"] == [v.HOLDS if x != v.UNSURE else v.UNSURE for x in t["verdict_old"]]).all()
    assert set(t["version_old"]) == {v.vllm_version(d)} and v.vllm_version(d) != "?"


def test_graph_modes_pair_a_powered_sweep_with_itself_as_versions_do():
    """powered_graph_modes and powered_versions share powered_pair: a powered sweep against itself joins every
    row, each side equal, a finding wherever a side is established; the sides are named by graph mode."""
    from sdlib.analysis.replay import graph_mode
    from sdlib.paths import REPO_ROOT
    from sdlib.store import SweepStore

    d = REPO_ROOT / "data" / "sweeps" / "embedded_powered"
    g = v.powered_graph_modes(d, d, n_boot=200)
    w = v.powered_versions(d, d, n_boot=200)
    assert len(g) and len(g) == len(w)
    assert (g["ratio_default"] == g["ratio_full"]).all() and (g["ratio_default"].values == w["ratio_old"].values).all()
    assert (g["finding"] == [v.HOLDS if x != v.UNSURE else v.UNSURE for x in g["verdict_default"]]).all()
    mode = graph_mode(SweepStore(d).read_provenance())  # the CPU build runs eager: NONE
    assert set(g["graph_mode_default"]) == set(g["graph_mode_full"]) == {mode} and mode == "NONE"
    assert set(g["kind"]) == {"over no SD", "over best fixed"} and "none" not in set(g["arm_policy"])
