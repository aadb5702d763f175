from sdlib.plots.titles import _notes, model_note


def test_title_notes_say_what_the_models_are():
    trained = {"tgt": {"trained": True, "params": 9_445_440}, "draft_model": {"trained": True, "params": 1_640_000}}
    assert model_note(trained["tgt"]) == "trained, 9.4M params"
    assert _notes(trained, ["tgt"]) == ["trained, 9.4M params", "trained drafters"]
    rnd = {"tgt": {"random_weights": True}, "eagle": {"random_weights": True}}
    assert _notes(rnd, ["tgt"]) == ["random weights"]
    assert _notes({"tgt": {"path": "/x"}}, ["tgt"]) == []


def test_bleu_bin_panel_draws_one_bar_per_label_and_bin():
    import pandas as pd

    from sdlib.plots.style import new_figure
    from sdlib.plots.bleu import bleu_bin_panel

    rows = [{"label": lab, "convention": conv, "bin": b, "relative_speedup": 0.1 * i, "num_requests": 3}
            for lab in ("n-gram k=3", "n-gram k=5") for conv in ("corrected", "authors")
            for i, b in enumerate(["0.0-0.2", "0.8-1.0"])]
    fig, axes = new_figure(1, 1)
    ax = axes[0][0]
    bleu_bin_panel(ax, pd.DataFrame(rows), ["n-gram k=3", "n-gram k=5"], "corrected", "authors", "EAGLE-3 k=3")
    assert len(ax.patches) == 2 * 5  # 2 labels x 5 bins (empty bins drawn as NaN bars)
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "0.8-1.0\nn=3"


def test_acceptance_and_weights_from_provenance():
    from sdlib.plots.titles import SweepFacts, acceptance_summary, method_acceptance, method_axis_label

    syn = {"name": "eagle3", "options": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}}
    assert method_acceptance(syn) == "synthetic L=2.5"
    assert method_acceptance({"name": "ngram", "replay": "oracle"}) == "replayed (oracle)"
    assert method_acceptance({"name": "eagle3"}) == "real" and method_acceptance({"name": "none"}) == "none"
    assert acceptance_summary([{"name": "none"}, syn]).startswith("synthetic acceptance, L = 2.5")
    assert acceptance_summary([{"name": "eagle3"}]).startswith("real acceptance")
    shape = {"random_weights": True, "kind": "shape", "note": "load_format=dummy"}
    assert model_note(shape) == "dummy weights of the real shape"
    facts = SweepFacts("s", ["t"], [], "", {"none": "none", "a": "real"}, "", "", "closed_loop", 1)
    assert method_axis_label(facts) == "method (k; real acceptance)"
    facts.acceptance_by_label = {"a": "synthetic L=2.5"}
    assert method_axis_label(facts) == "method (k, synthetic acceptance L)"


def test_sweep_titles_of_the_committed_sweeps_say_weights_acceptance_and_machine():
    from sdlib.plots.titles import sweep_title

    t = sweep_title("data/sweeps/h200_llama8b", "Speedup", "what is averaged")
    assert "dummy weights" in t and "synthetic acceptance, L = 1.5, 2.5, 3.5" in t
    assert "NVIDIA H200, vLLM 0.26.0; what is averaged" in t
    t = sweep_title("data/sweeps/embedded_default")
    assert "trained, 9.4M params" in t and "real acceptance" in t and "vLLM 0.32.0" in t
    assert "2x NVIDIA H200 (tensor parallel 2)" in sweep_title("data/sweeps/h200x2_llama70b_tp2")
