"""Saving what ``fit`` trained: checkpoint names vLLM loads, model folders, the manifest, packed parts.

Each folder is saved exactly as :mod:`sdlib.models.tinymodels` saves it (bf16
safetensors, same tensor names, configs and tokenizer files) plus its model
card ``sdlib_model.json``; :func:`check_layout` refuses weights whose names,
shapes or dtypes differ from the layout ``prepare`` recorded. The manifest is
tinymodels-compatible, so ``build_models`` finds the folder built.

Usage:
    sd = export_state("eagle3", head, draft_ids, vocab_size)
    check_layout(sd, json.load(open(".train/prepare.json"))["layout"]["eagle3"])
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Optional

from sdlib.models.train.files import write_json

#: Pieces of the packed tarball stay under this size (the device returns files <= 16 MB).
PART_BYTES = 15_000_000
PACK_NAME = "sdlib_models.tar.gz"


def export_state(component: str, module, draft_ids: Optional[list[int]], vocab: int) -> dict:
    """bf16 tensors under the checkpoint names tinymodels writes (+ d2t/t2d for EAGLE-3), sorted.

    The heads' training-time input scales are folded into ``fc.weight``
    (EAGLE-1: the embedding half; EAGLE-3: all of it), so vLLM computes the
    trained function with no scale. The target's and the draft's names are
    transformers' own (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``).
    """
    # deferred: torch takes seconds to import, and only this path needs it
    import torch

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
    """Raise ``ValueError`` if names, shapes or dtypes differ from the tinymodels checkpoint."""
    names = {"torch.bfloat16": "BF16", "torch.int64": "I64", "torch.bool": "BOOL", "torch.float32": "F32"}
    got = {k: {"shape": list(v.shape), "dtype": names.get(str(v.dtype), str(v.dtype))} for k, v in sd.items()}
    if got != layout:
        missing, extra = sorted(set(layout) - set(got)), sorted(set(got) - set(layout))
        diff = sorted(k for k in set(got) & set(layout) if got[k] != layout[k])
        raise ValueError(f"weights differ from the tinymodels layout: missing {missing}, "
                         f"extra {extra}, different {[(k, got[k], layout[k]) for k in diff]}")


def save_folder(out_dir: Path, component: str, sd: dict, data_dir: Path, prep: dict,
                make_card: Callable[[int, int], dict]) -> int:
    """Write ``out_dir/component`` atomically: weights ``sd``, the config files ``prepare`` kept,
    the tokenizer files the tinymodels folder had, and ``make_card(params, weights_bytes)``
    as ``sdlib_model.json``. Returns the number of (floating-point) parameters."""
    # deferred: safetensors is slow to import, and only this path needs it
    from safetensors.torch import save_file

    check_layout(sd, prep["layout"][component])
    dst = out_dir / component
    tmp = out_dir / f".saving-{component}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for p in (data_dir / "configs" / component).iterdir():
        shutil.copyfile(p, tmp / p.name)
    for name in prep["files"][component]:
        if name in prep["tokenizer_files"]:
            shutil.copyfile(data_dir / "tokenizer" / name, tmp / name)
    n = sum(v.numel() for v in sd.values() if v.is_floating_point())
    write_json(tmp / "sdlib_model.json", make_card(n, (tmp / "model.safetensors").stat().st_size))
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    return n


def write_manifest(out_dir: Path, data_dir: Path, prep: dict, fit_versions: dict, **fields) -> None:
    """``out_dir/manifest.json``: the tinymodels manifest ``prepare`` recorded, updated with
    ``fields`` (params, training, errors, ...) and the fit's versions; copies the tokenizer."""
    man = dict(prep["tinymodels_manifest"])
    man.update(fields, versions={**man.get("versions", {}), "fit": fit_versions})
    if (out_dir / "tokenizer").exists():
        shutil.rmtree(out_dir / "tokenizer")
    shutil.copytree(data_dir / "tokenizer", out_dir / "tokenizer")
    write_json(out_dir / "manifest.json", man)


def pack(out_dir: Path, pack_dir: Path, log: dict) -> list[str]:
    """``sdlib_models.tar.gz.partNN`` of ``out_dir`` + ``train_log.json`` into ``pack_dir``
    (replacing old parts); records the parts in ``log["packed"]``. Returns the part names."""
    pd = Path(pack_dir)
    pd.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdlib-pack-") as tmp:
        tar_path = Path(tmp) / PACK_NAME
        with tarfile.open(tar_path, "w:gz", compresslevel=6) as tf:
            for p in sorted(out_dir.rglob("*")):
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(out_dir).parts):
                    tf.add(p, arcname=str(p.relative_to(out_dir)))
        data = tar_path.read_bytes()
    for old in pd.glob(PACK_NAME + ".part*"):
        old.unlink()
    names = []
    for i in range(0, max(1, len(data)), PART_BYTES):
        name = f"{PACK_NAME}.part{i // PART_BYTES:02d}"
        (pd / name).write_bytes(data[i: i + PART_BYTES])
        names.append(name)
    log["packed"] = {"parts": names, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_json(pd / "train_log.json", log)
    return names
