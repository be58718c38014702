"""A Llama-family Hugging Face model read through its own modules, with a static KV cache.

:class:`HFModel` calls the model's ``forward`` with a ``DynamicCache``: every read concatenates
each layer's new keys onto its cache, builds a 4-D mask and runs Hugging Face's generic
plumbing: measured side by side on the same int8 modules (docs/results/profile, 2 cores), the
static cache reads k = 2–16 tokens ~10% faster (t(8) 104 vs 116 ms for the 1.5B target, 54 vs
59 ms for the 0.5B draft); one token costs the same. :class:`StaticCacheHFModel` keeps the same
weights and the same modules (embedding, norms, projections, MLP, rotary embedding, output layer — nothing is copied
or re-implemented but the residual wiring of a decoder layer and the attention call) and gives
them a cache in the style of gpt-fast: one preallocated key and value tensor per layer, written
at the slots a read fills; rollback (``crop``) only moves the length, and ``keep_path`` copies
the kept slots next to the committed chain. Slots are :class:`~.base.CacheTree` slots, so chains,
trees and rollback behave exactly as in :class:`HFModel` (tested logit for logit against it).

Only decoder layers of the Llama form (``x + o_proj(attn(rope(q), rope(k), v))``, then
``x + mlp(norm(x))``, full causal attention, no sliding window) are read this way:
:func:`static_cache_unsupported` says why another model is not, and :func:`wrap_hf_model` then
falls back to :class:`HFModel`. A model made batch-invariant
(:func:`~specbound.models.int8.make_batch_invariant`) keeps its cache and attention in float64,
as its registered attention does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import SpecboundError
from .base import CacheTree, ModelInfo
from .hf import HFModel, attention_shape

__all__ = ["STATIC_CACHE_MODEL_TYPES", "RowRead", "StaticCacheHFModel", "read_rows", "static_cache_unsupported",
           "wrap_hf_model"]

#: ``config.model_type`` values whose decoder layers have the Llama form read here.
STATIC_CACHE_MODEL_TYPES = ("qwen2", "llama")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")


def static_cache_unsupported(model) -> str | None:
    """Why ``model`` cannot be read with a static cache (None when it can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in STATIC_CACHE_MODEL_TYPES:
        return f"model type {kind!r} is not one of {', '.join(STATIC_CACHE_MODEL_TYPES)}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")) \
            or not hasattr(model, "lm_head"):
        return "not the Llama module layout (model.embed_tokens/layers/norm/rotary_emb, lm_head)"
    for layer in inner.layers:
        if not all(hasattr(layer, n) for n in _LAYER_PARTS) or \
                not all(hasattr(layer.self_attn, n) for n in _ATTENTION_PARTS):
            return "a decoder layer without the Llama parts (norms, q/k/v/o projections, mlp)"
        if getattr(layer.self_attn, "sliding_window", None):
            return "sliding-window attention"
        if hasattr(layer.self_attn, "q_norm"):
            return "query/key norms"
    return None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticCacheHFModel(HFModel):
    """An :class:`HFModel` whose reads run the decoder layers directly over a static KV cache."""

    def __init__(self, model, tokenizer=None, name: str | None = None, info: ModelInfo | None = None):
        reason = static_cache_unsupported(model)
        if reason is not None:
            raise SpecboundError(f"{name or type(model).__name__} cannot use a static cache: {reason}")
        config = model.config
        self.n_heads, self.n_kv_heads, self.head_dim = attention_shape(config)
        from .int8 import ATTENTION_NAME

        invariant = getattr(config, "_attn_implementation", None) == ATTENTION_NAME
        self.attention_dtype = torch.float64 if invariant else next(model.parameters()).dtype
        self.keys = self.values = None
        self.scheduler = None          # a batch's pass scheduler while this model is one of its rows
        self.batch_priority = 1        # rows of lower priority (the draft) read first in a batch
        super().__init__(model, tokenizer, name, info)

    # ------------------------------------------------------------------ cache
    def _cache_dtype(self) -> torch.dtype:
        return self.attention_dtype

    def reset(self) -> None:
        self.slots = CacheTree(self.name)
        self.cache = None          # the protocol's DynamicCache is not used

    def _reserve(self, length: int) -> None:
        """Grow the key/value tensors (doubling) to hold ``length`` slots."""
        have = 0 if self.keys is None else self.keys.shape[3]
        if length <= have:
            return
        size = max(length, 2 * have, 256)
        limit = self.info.max_positions
        if limit is not None:
            size = max(length, min(size, limit))
        layers = len(self.model.model.layers)
        shape = (layers, 1, self.n_kv_heads, size, self.head_dim)
        keys = torch.zeros(shape, dtype=self.attention_dtype)
        values = torch.zeros(shape, dtype=self.attention_dtype)
        if have:
            keys[..., :have, :] = self.keys
            values[..., :have, :] = self.values
        self.keys, self.values = keys, values

    def crop(self, length: int) -> None:
        self.slots.crop(length)          # slots past the length are overwritten by the next read

    def keep_path(self, base_length: int, path) -> None:
        kept = self.slots.keep_path(base_length, path)
        tail = kept[base_length:]
        if tail and tail != list(range(base_length, base_length + len(tail))):
            index = torch.as_tensor(tail, dtype=torch.long)
            dst = slice(base_length, base_length + len(tail))
            self.keys[..., dst, :] = self.keys.index_select(3, index)
            self.values[..., dst, :] = self.values.index_select(3, index)

    # ------------------------------------------------------------------ rows of a batch
    rows_share_passes = True

    def fork(self) -> "StaticCacheHFModel":
        """A new row: the same modules (weights shared, nothing copied) with an empty cache of its own.
        Rows' reads can run together in one pass (:func:`read_rows`) when a batch scheduler holds them."""
        row = copy.copy(self)
        row.keys = row.values = None
        row.scheduler = None
        row.reset()
        return row

    # ------------------------------------------------------------------ forwards
    def _run(self, tokens, positions, mask, keep_logits) -> torch.Tensor:
        k = tokens.shape[1]
        start = self.slots.length
        end = start + k
        self._reserve(end)
        if mask is None:                 # a chain after the last slot: causal within the call
            visible = torch.ones(k, end, dtype=torch.bool)
            visible[:, start:] = torch.ones(k, k, dtype=torch.bool).tril_()
        else:
            visible = mask[0, 0] == 0
        read = RowRead(self, tokens, list(positions), visible, start, end, keep_logits)
        if self.scheduler is not None:
            return self.scheduler.submit(read_rows, read, group=id(self.model), priority=self.batch_priority)
        return read_rows([read])[0]


@dataclass
class RowRead:
    """One row's read: its model (cache), tokens [1, k], their positions, visibility [k, end] over the
    row's slots, the slots ``start..end-1`` it fills, and how many last logits it keeps (None = all)."""

    model: StaticCacheHFModel
    tokens: torch.Tensor
    positions: list
    visible: torch.Tensor
    start: int
    end: int
    keep_logits: int | None


def read_rows(reads: list[RowRead]) -> list[torch.Tensor]:
    """ONE pass of the decoder over several rows' reads (rows of the same weights, each with its own
    cache): the tokens of all rows go through every projection, norm and MLP together — a forward's
    cost is its weight read, shared by the batch — and each row attends over its OWN cache slots with
    its own mask, exactly as it would alone (no padding, no row sees another's keys or a stale slot).
    Returns each row's next-token logits [1, k or keep_logits, vocab], in order."""
    owner = reads[0].model
    model, inner = owner.model, owner.model.model
    nh, nkv, hd, dtype = owner.n_heads, owner.n_kv_heads, owner.head_dim, owner.attention_dtype
    sizes = [r.tokens.shape[1] for r in reads]
    bounds = np.cumsum([0] + sizes).tolist()
    n = bounds[-1]
    with torch.inference_mode():
        tokens = reads[0].tokens if len(reads) == 1 else torch.cat([r.tokens for r in reads], dim=1)
        positions = [p for r in reads for p in r.positions]
        x = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(x, torch.as_tensor([positions], dtype=torch.long))
        cos, sin = cos[:, None], sin[:, None]                    # [1, 1, n, hd]
        biases = [torch.zeros(r.visible.shape, dtype=dtype).masked_fill_(~r.visible, float("-inf")) for r in reads]
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, n, nh, hd).transpose(1, 2)
            key = attn.k_proj(h).view(1, n, nkv, hd).transpose(1, 2)
            value = attn.v_proj(h).view(1, n, nkv, hd).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            key = key * cos + _rotate_half(key) * sin
            outs = []
            for r, bias, a, b in zip(reads, biases, bounds, bounds[1:]):
                row = r.model
                row.keys[i, :, :, r.start:r.end] = key[:, :, a:b]
                row.values[i, :, :, r.start:r.end] = value[:, :, a:b]
                outs.append(F.scaled_dot_product_attention(
                    q[:, :, a:b].to(dtype), row.keys[i, :, :, :r.end], row.values[i, :, :, :r.end],
                    attn_mask=bias, scale=attn.scaling, enable_gqa=nkv != nh))
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
            x = x + attn.o_proj(out.to(x.dtype).transpose(1, 2).reshape(1, n, nh * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        keep = [(b - r.keep_logits if r.keep_logits else a, b) for r, a, b in zip(reads, bounds, bounds[1:])]
        if len(reads) == 1:
            kept = x[:, keep[0][0]:keep[0][1]]
        else:
            kept = torch.cat([x[:, a:b] for a, b in keep], dim=1)
        logits = model.lm_head(inner.norm(kept)).float()
    return list(logits.split([b - a for a, b in keep], dim=1))


def wrap_hf_model(model, tokenizer=None, name: str | None = None, static: bool = True) -> HFModel:
    """``model`` behind the protocol: a :class:`StaticCacheHFModel` where its layers allow it
    (and ``static``), else an :class:`HFModel` over the model's own forward."""
    if static and static_cache_unsupported(model) is None:
        return StaticCacheHFModel(model, tokenizer, name)
    return HFModel(model, tokenizer, name)
