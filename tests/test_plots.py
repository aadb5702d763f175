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
