"""The target and the draft: transformers' ``LlamaForCausalLM``, built from a ``config.json``.

:func:`new_llama` seeds the initial weights the way the trainer always has
(Normal(0, ``initializer_range``) on every linear and embedding weight, drawn
in module order after the modules' own default draws), so a seed gives the
same initial weights as the plain-torch Llama that trained the committed
models. :func:`lm_features` adds what the EAGLE heads read: the final normed
hidden state and the residual stream at vLLM's auxiliary layer ids.

Usage:
    from sdlib.models.train.llama import new_llama, lm_features
    model = new_llama(json.load(open(".train/configs/target/config.json")), seed=0)
    logits, h, aux = lm_features(model, ids, aux_ids=(1, 3, 5))
"""

from __future__ import annotations

import torch
import torch.nn as nn

from sdlib.models.train.modules import init_weights


def new_llama(cfg: dict, seed: int, std: float | None = None):
    """A float32 ``LlamaForCausalLM`` (SDPA attention) for ``cfg`` with seeded Normal(0, std) weights
    (``std``: default the config's ``initializer_range``)."""
    # deferred: transformers takes seconds to import, and only this path needs it
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg, attn_implementation="sdpa")).float()
    std = cfg.get("initializer_range", 0.02) if std is None else std
    torch.manual_seed(seed)
    # the draws a plain nn.Linear / nn.Embedding stack makes when it is built, then the init
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.reset_parameters()
    init_weights(model, std)
    return model


def lm_logits(model, ids):
    """Next-token logits (B, T, V) of a causal LM for token ids (B, T); no KV cache."""
    return model(input_ids=ids, use_cache=False).logits


def lm_features(model, ids, aux_ids: tuple[int, ...] = ()):
    """(logits, final normed hidden, [residual stream at each of ``aux_ids``, in ascending order]).

    ``aux_ids`` follow vLLM: 0 = embeddings, i = output of decoder layer i-1
    (before any norm, also for i = the number of layers). Taken with forward
    hooks, so they do not depend on how a transformers version reports hidden states.
    """
    inner = model.model
    if any(not 0 <= i <= len(inner.layers) for i in aux_ids):
        raise ValueError(f"aux layer ids {aux_ids} must be in [0, {len(inner.layers)}]")
    aux: dict[int, torch.Tensor] = {}

    def keep(i):
        return lambda _m, _a, out: aux.__setitem__(i, out[0] if isinstance(out, tuple) else out)

    hooks = []
    if 0 in aux_ids:
        hooks.append(inner.embed_tokens.register_forward_hook(keep(0)))
    for i, layer in enumerate(inner.layers):
        if i + 1 in aux_ids:
            hooks.append(layer.register_forward_hook(keep(i + 1)))
    try:
        h = inner(input_ids=ids, use_cache=False).last_hidden_state
    finally:
        for hk in hooks:
            hk.remove()
    return model.lm_head(h), h, [aux[i] for i in sorted(aux_ids)]
