from sdlib.plots import _notes, model_note


def test_title_notes_say_what_the_models_are():
    trained = {"tgt": {"trained": True, "params": 9_445_440}, "draft_model": {"trained": True, "params": 1_640_000}}
    assert model_note(trained["tgt"]) == "trained, 9.4M params"
    assert _notes(trained, ["tgt"]) == ["trained, 9.4M params", "trained drafters"]
    rnd = {"tgt": {"random_weights": True}, "eagle": {"random_weights": True}}
    assert _notes(rnd, ["tgt"]) == ["random weights"]
    assert _notes({"tgt": {"path": "/x"}}, ["tgt"]) == []
