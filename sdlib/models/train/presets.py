"""What the trainer builds: components, corpus sources, and the two presets (sizes + corpus plan).

``default`` is the preset of the committed weights in ``data/models`` (trained
on one H200); ``tiny`` is for the CPU tests (seconds).

Usage:
    from sdlib.models.train.presets import PRESETS, MODEL_COMPONENTS
    PRESETS["default"].models.target          # LlamaShape(320, 6, 10, 5, 864)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sdlib.models import tinymodels as tm
from sdlib.models.llama_shape import LlamaShape

#: The trained components, in training order (``tokenizer`` is copied as is).
MODEL_COMPONENTS = ("target", "draft", "eagle", "eagle3")
#: Corpus sources, in this order in the held-out file and the per-source stats.
SOURCES = ("sharegpt", "humaneval", "code_edit")
#: Bump when the layout of the prepared folder (``.train/``) changes.
DATA_FORMAT = 1
#: The embedded sweep samples prompts with this seed (``WorkloadConfig.seed``'s default).
SWEEP_SEED = 42


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
    """Model sizes (for :func:`sdlib.models.tinymodels.build_models`) and the corpus plan."""

    models: tm.TinyModelsConfig
    corpus: CorpusPlan


#: ``default``: the GPU run (~14.7M parameters in all, ~29 MB of bf16 weights:
#: target 6 x 320 (9.4M), draft 3 x 128 (1.6M), EAGLE-1 (1.3M), EAGLE-3 (2.3M)).
#: ``tiny``: CPU tests (seconds).
PRESETS: dict[str, Preset] = {
    "default": Preset(
        models=tm.TinyModelsConfig(
            target=LlamaShape(320, 6, 10, 5, 864),
            draft=LlamaShape(128, 3, 4, 2, 384),
        ),
        corpus=CorpusPlan(),
    ),
    "tiny": Preset(
        models=tm.TinyModelsConfig(
            vocab_size=1024,
            target=LlamaShape(64, 2, 2, 1, 128),
            draft=LlamaShape(32, 1, 1, 1, 64),
            eagle3_draft_vocab_size=512,
            corpus=tm.CorpusConfig(sharegpt_prefix_bytes=400_000, sharegpt_chars=100_000,
                                   stdlib_chars=100_000),
        ),
        corpus=CorpusPlan(seq_len=128, max_prompt_tokens=None, sharegpt_docs=48, humaneval_docs=8,
                          code_edit_docs=24, heldout_sharegpt=8, heldout_humaneval=4,
                          heldout_code_edit=4, sharegpt_later_turns=False, max_train_tokens=200_000),
    ),
}
