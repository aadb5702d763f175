"""sdlib.vllm.proposers.NgramOrDraft without an engine: vLLM's look-up where it matches, the draft model's k
greedy tokens elsewhere, nothing for prefill rows; and the config's ``custom`` method."""

from types import SimpleNamespace

import numpy as np
import pytest

from sdlib.config import ConfigError, parse_sweep

@pytest.mark.engine  # imports vLLM's look-up (the CPU build)
def test_ngram_or_draft_rows():
    from sdlib.vllm.proposers import NgramOrDraft

    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                          model_config=SimpleNamespace(max_model_len=64))
    p = NgramOrDraft(cfg)
    p.load_model()
    toks = np.zeros((3, 64), dtype=np.int32)
    toks[0, :8] = [5, 6, 7, 8, 9, 5, 6, 7]  # "5 6 7" seen before: continuation 8 9 5
    toks[1, :6] = [10, 11, 12, 13, 14, 15]  # no repeat: the draft model drafts 3
    out = p.propose([[7], [15], []], np.array([8, 6, 4]), toks)
    assert out[0] == [8, 9, 5]
    assert len(out[1]) == 3 and all(isinstance(t, int) for t in out[1])
    assert out[2] == []
    assert p.stats == {"steps": 1, "rows_ngram": 1, "rows_draft": 1}


def test_custom_method_config():
    base = {"name": "x", "models": [{"path": "/m"}], "workloads": [{"dataset": "sharegpt"}], "batch_sizes": [1]}
    s = parse_sweep({**base, "methods": [{"name": "custom", "model": "sdlib.vllm.proposers.NgramOrDraft"}]})
    assert s.methods[0].speculative_config() == {"method": "custom_class", "num_speculative_tokens": 3,
                                                 "model": "sdlib.vllm.proposers.NgramOrDraft"}
    with pytest.raises(ConfigError, match="custom"):
        parse_sweep({**base, "methods": [{"name": "custom", "model": "data/models/draft"}]})


def test_preflight_imports_a_custom_proposer_class_instead_of_looking_for_a_model(monkeypatch):
    """A proposer class is not a model folder or Hub id: preflight imports it (offline), and names the field
    when the module or the class is missing (it once refused configs/embedded_custom.yaml offline)."""
    import sdlib.run.preflight as pf
    from sdlib.config import load_sweep
    from sdlib.paths import resolve

    monkeypatch.setattr(pf, "hub_reachable", lambda: False)
    for cfg in ("configs/embedded_custom.yaml", "configs/h200_hookoff.yaml"):
        sweep = load_sweep(resolve(cfg))
        for i, m in enumerate(sweep.methods):
            if m.name == "custom":
                pf._check_proposer_class(f"methods.{i}.model", m.model)  # imports, no error
    with pytest.raises(ConfigError, match=r"methods\.3\.model: .*no class 'Nope'"):
        pf._check_proposer_class("methods.3.model", "sdlib.vllm.proposers.Nope")
    with pytest.raises(ConfigError, match=r"methods\.0\.model: cannot import 'sdlib\.nope'"):
        pf._check_proposer_class("methods.0.model", "sdlib.nope.Class")


def test_propose_nothing_drafts_nothing():
    from sdlib.vllm.proposers import ProposeNothing

    p = ProposeNothing(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3)))
    p.load_model()
    assert p.propose([[1], [2], []], np.array([4, 5, 1]), np.zeros((3, 8), np.int32)) == [[], [], []]
