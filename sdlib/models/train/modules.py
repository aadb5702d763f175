"""The EAGLE-1 and EAGLE-3 heads in plain torch, with the parameter names vLLM loads.

The target and the draft are transformers' ``LlamaForCausalLM``
(:mod:`sdlib.models.train.llama`); only the heads are written here, because
training them needs what no library class offers: the drafting loop unrolled
over every position at once ("training-time test"), where drafting step s
attends like vLLM's drafting loop (:func:`ttt_mask`). The maths is Llama's
(RMSNorm, rotary embeddings in transformers' ``rotate_half`` convention,
SiLU MLP) and vLLM's ``llama_eagle.py`` / ``llama_eagle3.py``.

Usage:
    from sdlib.models.train import modules as hm
    head = hm.head_from_config("eagle3", json.load(open("data/models/eagle3/config.json")), n_aux=3)
    cos, sin = hm.rope(T, head.shape.head_dim, head.rope_theta, "cpu")
    outs = hm.unroll_head(head, emb, head.combine(aux), cos, sin, n_steps=3)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from sdlib.models.llama_shape import LlamaShape, rope_theta

_rope_cache: dict = {}
_mask_cache: dict = {}


def rope(n: int, head_dim: int, theta: float, device):
    """(cos, sin), each (n, head_dim) float32, for positions 0..n-1 (cached)."""
    key = (n, head_dim, theta, str(device))
    if key not in _rope_cache:
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        _rope_cache[key] = (emb.cos(), emb.sin())
    return _rope_cache[key]


def apply_rope(x, cos, sin):
    """Rotate ``x`` (B, heads, T, head_dim); transformers' ``rotate_half`` convention."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    d = x.shape[-1] // 2
    rot = torch.cat((-x[..., d:], x[..., :d]), dim=-1)
    return x * cos + rot * sin


def ttt_mask(T: int, step: int, device):
    """Attention of drafting step ``step`` (>= 1) over the keys of steps 0..step, (T, (step+1)*T) bool.

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


class RMSNorm(nn.Module):
    """Llama's RMSNorm (computed in float32, scaled in the input's dtype)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class Attention(nn.Module):
    """Grouped-query attention; with a ``cache`` list, step s > 0 attends over the keys of
    steps 0..s through :func:`ttt_mask`."""

    def __init__(self, s: LlamaShape, in_dim: int):
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
    def __init__(self, s: LlamaShape):
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

    def __init__(self, s: LlamaShape, qkv_in: int, eps: float, input_norm: bool = True,
                 hidden_norm: bool = False):
        super().__init__()
        H = s.hidden_size
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


class Eagle1(nn.Module):
    """vLLM ``EagleLlamaForCausalLM``: x = fc(cat(embed(t), h)) -> layers -> x (no norm);
    logits = target lm_head(x); x is the next step's ``h``.

    Nothing normalizes the input, and token embeddings are ~40x smaller than
    the target's features, so training uses ``fc(cat(emb_scale * embed(t), h))``
    (``emb_scale`` fixed, set from the target) and the export folds the scale
    into ``fc.weight``: the same function, but the embedding half learns at
    the pace of the feature half.
    """

    def __init__(self, s: LlamaShape, n_layers: int, eps: float = 1e-5, theta: float = 10000.0):
        super().__init__()
        H = s.hidden_size
        self.shape, self.rope_theta = s, theta
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList(Block(s, H, eps, input_norm=i > 0) for i in range(n_layers))
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

    def __init__(self, s: LlamaShape, n_layers: int, n_aux: int, draft_vocab: int, eps: float = 1e-5,
                 theta: float = 10000.0):
        super().__init__()
        H = s.hidden_size
        self.shape, self.rope_theta = s, theta
        self.fc = nn.Linear(n_aux * H, H, bias=False)
        self.midlayer = Block(s, 2 * H, eps, input_norm=True, hidden_norm=True)
        self.layers = nn.ModuleDict({str(i): Block(s, H, eps, hidden_norm=True) for i in range(1, n_layers)})
        self.norm = RMSNorm(H, eps)
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


def head_from_config(component: str, cfg: dict, n_aux: int = 3):
    """A fresh head (``eagle`` or ``eagle3``) sized by its ``config.json`` (dict); EAGLE-3 reads
    ``n_aux`` target states and drafts over ``draft_vocab_size`` tokens."""
    s, eps, theta = LlamaShape.from_config(cfg), cfg["rms_norm_eps"], rope_theta(cfg)
    if component == "eagle":
        return Eagle1(s, cfg["num_hidden_layers"], eps, theta)
    if component == "eagle3":
        dv = cfg.get("draft_vocab_size") or cfg["vocab_size"]
        return Eagle3(s, cfg["num_hidden_layers"], n_aux, dv, eps, theta)
    raise ValueError(f"not a head: {component!r}")


def unroll_head(head, emb, h0, cos, sin, n_steps: int) -> list:
    """Outputs of ``n_steps`` drafting steps of an EAGLE head, for every position at once.

    ``emb[:, p]``: embedding of the token after position p; ``h0[:, p]``: the
    step-0 feature at p (EAGLE-1: the target's last hidden state; EAGLE-3:
    ``fc`` of its auxiliary states). Step s at position p continues the chain
    whose last verified position is p - s: its feature is step s-1's output at
    p - 1, and it attends like vLLM's drafting loop (see :func:`ttt_mask`).
    Entry s of the result is meaningful where p >= s.
    """
    caches = [[] for _ in head.blocks()]
    h, outs = h0, []
    for s in range(n_steps):
        x = head.step(emb, h, cos, sin, caches, s)
        outs.append(x)
        h = torch.cat((torch.zeros_like(x[:, :1]), x[:, :-1]), dim=1)
    return outs


def init_weights(module, std: float) -> None:
    """Normal(0, std) for linear/embedding weights, in module order; norm weights stay 1."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(m.weight, mean=0.0, std=std)
