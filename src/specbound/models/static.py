"""A Llama-family Hugging Face model read through its own modules, with a static KV cache.

:class:`HFModel` calls the model's ``forward`` with a ``DynamicCache`` (each read concatenates every
layer's new keys, builds a 4-D mask and runs Hugging Face's generic plumbing); on the same int8 modules
the static cache reads k = 2–16 tokens ~10% faster, one token at the same cost (docs/results/profile).
:class:`StaticCacheHFModel` keeps the same weights and modules (nothing is copied or re-implemented but
the residual wiring of a decoder layer and the attention call) and gives them a cache in the style of
gpt-fast: one preallocated key and value tensor per layer, written at the slots a read fills; ``crop``
only moves the length, ``keep_path`` copies the kept slots next to the committed chain. Slots are
:class:`~.base.CacheTree` slots, tested logit for logit against :class:`HFModel`. Only Llama-form decoder
layers are read this way (:func:`static_cache_unsupported` says why another is not, and
:func:`wrap_hf_model` falls back to :class:`HFModel`); a model made batch-invariant keeps its cache and
attention in float64. In full: docs/notes.md (`models/static.py`).
"""
from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import SpecboundError
from .base import CacheTree, ModelInfo
from .hf import HFModel, attention_shape
from .int8 import _SharedInputSlice

__all__ = ["STATIC_CACHE_MODEL_TYPES", "RowRead", "StaticCacheHFModel", "compiled_layer_step", "layer_step", "read_rows",
           "static_cache_unsupported",
           "wrap_hf_model"]

#: ``config.model_type`` values whose decoder layers have the Llama form read here.
STATIC_CACHE_MODEL_TYPES = ("qwen2", "llama")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


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
                not all(hasattr(layer.self_attn, n) for n in _ATTENTION_PARTS) or \
                not all(hasattr(layer.mlp, n) for n in _MLP_PARTS):
            return "a decoder layer without the Llama parts (norms, q/k/v/o projections, gated mlp)"
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
        self.compiled = False          # single-row reads through compiled_layer_step (load_model(compiled=True))
        self.scheduler = None          # a batch's pass scheduler while this model is one of its rows
        self.batch_priority = 1        # rows of lower priority (the draft) read first in a batch
        super().__init__(model, tokenizer, name, info)

    # ------------------------------------------------------------------ cache
    def _cache_dtype(self) -> torch.dtype:
        return self.attention_dtype

    def reset(self) -> None:
        self.slots = CacheTree(self.name)
        self.cache = None          # the protocol's DynamicCache is not used

    @property
    def capacity(self) -> int:
        """Slots the key/value tensors hold now (they grow by doubling)."""
        return 0 if self.keys is None else self.keys[0].shape[2]

    def _reserve(self, length: int) -> None:
        """Grow the key/value tensors (doubling) to hold ``length`` slots and at least one more: a read
        never fills the cache to its last slot, so a compiled step never meets ``keys[:, :, :end]`` with
        ``end`` equal to the tensor's size (a case torch.compile specialises on: measured, a recompile of
        seconds inside a timed read). One tensor per layer ([1, kv heads, slots, head dim]): a compiled
        layer step writes its own layer's tensor in place."""
        have = self.capacity
        if length < have:
            return
        size = max(length + 1, 2 * have, 256)
        limit = self.info.max_positions
        if limit is not None:
            size = max(length, min(size, limit))
        shape = (1, self.n_kv_heads, size, self.head_dim)
        keys, values = [], []
        for i in range(len(self.model.model.layers)):
            keys.append(torch.zeros(shape, dtype=self.attention_dtype))
            values.append(torch.zeros(shape, dtype=self.attention_dtype))
            if have:
                keys[i][:, :, :have] = self.keys[i]
                values[i][:, :, :have] = self.values[i]
        self.keys, self.values = keys, values

    def crop(self, length: int) -> None:
        self.slots.crop(length)          # slots past the length are overwritten by the next read

    def keep_path(self, base_length: int, path) -> None:
        kept = self.slots.keep_path(base_length, path)
        tail = kept[base_length:]
        if tail and tail != list(range(base_length, base_length + len(tail))):
            index = torch.as_tensor(tail, dtype=torch.long)
            dst = slice(base_length, base_length + len(tail))
            for cache in (*self.keys, *self.values):
                cache[:, :, dst] = cache.index_select(2, index)

    def compile_now(self) -> float | None:
        """Build the compiled graphs of :func:`compiled_layer_step` now, on a throwaway row (a prompt
        read, one-token and k-token reads), so that no timed read pays for compiling; returns the
        seconds it took (2-6 s here with inductor's disk cache warm, ~30 s cold). Where compiling
        fails (no C++ compiler, an unsupported platform) this model reads eagerly from then on, with
        a warning saying why, and None is returned."""
        t0 = time.perf_counter()
        row = self.fork()
        row.compiled = True
        try:
            row.prefill([0, 1, 2])
            for tokens in ([3], [4, 5], [6], [7, 8, 9]):
                row.forward(torch.tensor([tokens]))
            # a grown cache (a prompt and its output past 256 slots) changes the graphs' input sizes: the
            # size-generic graphs are built here too, not in the first timed read that outgrows the cache
            # (measured before: seconds lost on one held-out prompt of 225 tokens, plain and SD alike)
            row._reserve(row.capacity + 1)
            for tokens in ([10], [11, 12, 13]):
                row.forward(torch.tensor([tokens]))
        except Exception as exc:  # noqa: BLE001 - any compiler failure leaves the eager reads, which are the same
            self.compiled = False
            warnings.warn(f"{self.name}: torch.compile failed ({type(exc).__name__}: {str(exc)[:200]}); "
                          "its reads stay eager (the same logits, ~10% slower)", stacklevel=2)
            return None
        return time.perf_counter() - t0

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
    A single row of a model loaded with ``compiled=True`` runs its layers through the compiled layer
    step (:func:`compiled_layer_step`); the same operations, the same bits (tested).
    Returns each row's next-token logits [1, k or keep_logits, vocab], in order."""
    owner = reads[0].model
    model, inner = owner.model, owner.model.model
    shape = (owner.n_heads, owner.n_kv_heads, owner.head_dim, owner.attention_dtype)
    sizes = [r.tokens.shape[1] for r in reads]
    bounds = np.cumsum([0] + sizes).tolist()
    step = compiled_layer_step() if owner.compiled and len(reads) == 1 else layer_step
    with torch.inference_mode():
        tokens = reads[0].tokens if len(reads) == 1 else torch.cat([r.tokens for r in reads], dim=1)
        positions = [p for r in reads for p in r.positions]
        x = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(x, torch.as_tensor([positions], dtype=torch.long))
        cos, sin = cos[:, None], sin[:, None]                    # [1, 1, n, hd]
        biases = [torch.zeros(r.visible.shape, dtype=shape[3]).masked_fill_(~r.visible, float("-inf"))
                  for r in reads]
        slots = [torch.arange(r.start, r.end) for r in reads]
        for i, layer in enumerate(inner.layers):
            rows = [(r.model.keys[i], r.model.values[i], slot, r.end, bias, a, b)
                    for r, slot, bias, a, b in zip(reads, slots, biases, bounds, bounds[1:])]
            x = step(layer, x, cos, sin, rows, shape)
        keep = [(b - r.keep_logits if r.keep_logits else a, b) for r, a, b in zip(reads, bounds, bounds[1:])]
        if len(reads) == 1:
            kept = x[:, keep[0][0]:keep[0][1]]
        else:
            kept = torch.cat([x[:, a:b] for a, b in keep], dim=1)
        logits = model.lm_head(inner.norm(kept)).float()
    return list(logits.split([b - a for a, b in keep], dim=1))


def _projections(parent, names, h):
    """The outputs of ``parent``'s layers ``names`` on the input h: one GEMM and views of its
    columns when :func:`~specbound.models.int8.fuse_shared_inputs` fused them, else each layer."""
    layers = [getattr(parent, n) for n in names]
    first = layers[0]
    if isinstance(first, _SharedInputSlice) and all(isinstance(m, _SharedInputSlice) and m.fused is first.fused
                                                     for m in layers):
        fused = first.fused(h)
        return [fused[..., m.start:m.stop] for m in layers]
    return [m(h) for m in layers]


def layer_step(layer, x, cos, sin, rows, shape):
    """One decoder layer of the Llama form over the tokens x [1, n, d] of one pass: norm, q/k/v,
    rotary, then per row (keys, values, slots, end, bias, a, b) its tokens a:b written into its cache
    at ``slots`` and attending over slots 0..end-1 with its additive mask; o_proj, residual, MLP."""
    nh, nkv, hd, dtype = shape
    gqa = bool(nkv != nh)
    attn, n = layer.self_attn, x.shape[1]
    q, key, value = _projections(attn, ("q_proj", "k_proj", "v_proj"), layer.input_layernorm(x))
    q = q.view(1, n, nh, hd).transpose(1, 2)
    key = key.view(1, n, nkv, hd).transpose(1, 2)
    value = value.view(1, n, nkv, hd).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    key = key * cos + _rotate_half(key) * sin
    outs = []
    for keys, values, slots, end, bias, a, b in rows:
        keys.index_copy_(2, slots, key[:, :, a:b].to(dtype))
        values.index_copy_(2, slots, value[:, :, a:b].to(dtype))
        outs.append(F.scaled_dot_product_attention(q[:, :, a:b].to(dtype), keys[:, :, :end], values[:, :, :end],
                                                   attn_mask=bias, scale=attn.scaling, enable_gqa=gqa))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    x = x + attn.o_proj(out.to(x.dtype).transpose(1, 2).reshape(1, n, nh * hd))
    mlp = layer.mlp
    gate, up = _projections(mlp, ("gate_proj", "up_proj"), layer.post_attention_layernorm(x))
    return x + mlp.down_proj(mlp.act_fn(gate) * up)


_COMPILED_STEP: list = []


def compiled_layer_step():
    """:func:`layer_step` through ``torch.compile`` (inductor, dynamic shapes): the norms, rotary,
    per-token scales, SiLU and residual adds of a layer fuse into a few C++ loops around the GEMMs
    and the attention call. One graph serves every layer of the same form (the modules' tensors are
    graph inputs), recompiled once with dynamic sizes when the tokens per read or the cache length
    first change; built on the first reads (seconds to tens of seconds, then cached on disk by inductor)."""
    if not _COMPILED_STEP:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _COMPILED_STEP.append(torch.compile(layer_step))
    return _COMPILED_STEP[0]


def wrap_hf_model(model, tokenizer=None, name: str | None = None, static: bool = True) -> HFModel:
    """``model`` behind the protocol: a :class:`StaticCacheHFModel` where its layers allow it
    (and ``static``), else an :class:`HFModel` over the model's own forward."""
    if static and static_cache_unsupported(model) is None:
        return StaticCacheHFModel(model, tokenizer, name)
    return HFModel(model, tokenizer, name)
