"""The shape of a Llama decoder stack, defined once for the tiny models and the trainer.

:mod:`sdlib.models.tinymodels` builds ``config.json`` files from a
:class:`LlamaShape`; :mod:`sdlib.models.train` reads one back from a
``config.json`` (:meth:`LlamaShape.from_config`) to size the EAGLE heads.

Usage:
    from sdlib.models.llama_shape import LlamaShape
    LlamaShape(320, 6, 10, 5, 864)                                  # the default preset's target
    LlamaShape.from_config(json.load(open("data/models/eagle3/config.json")))
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaShape:
    """Shape of a Llama decoder stack (sizes in elements, not bytes)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    head_dim: int = 32  # vLLM's CPU attention rejects 16

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_config(cls, cfg: dict) -> "LlamaShape":
        """The stack of a transformers-style ``config.json`` (dict); missing
        ``num_key_value_heads`` / ``head_dim`` take Llama's defaults."""
        heads = cfg["num_attention_heads"]
        return cls(
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            intermediate_size=cfg["intermediate_size"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        )


def rope_theta(cfg: dict) -> float:
    """RoPE base of a ``config.json`` (transformers 5 nests it in ``rope_parameters``)."""
    rope = cfg.get("rope_parameters") or {}
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
