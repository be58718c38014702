"""Any Hugging Face ``AutoModelForCausalLM``, unmodified, behind the :class:`LanguageModel` protocol.

The KV cache is a ``transformers.DynamicCache`` whose slots follow :class:`~.base.CacheTree`: a
committed chain, then tree slots. Chain reads pass plain position ids; tree reads pass a 4-D
attention mask (each node sees the committed chain and its ancestors, cached or in the call) and
per-node position ids, so a drafter can attach new nodes under any cached node. ``keep_path``
moves the kept slots next to the committed chain and crops the rest; rollback after a rejection
is a crop. No modeling file is forked.
"""
from __future__ import annotations

import torch

from ..errors import SpecboundError
from .base import CacheTree, ModelInfo, SlotCacheModel

__all__ = ["HFModel"]


def _output_size(model) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.vocab_size)


def attention_shape(config) -> tuple[int, int, int]:
    """(attention heads, key/value heads, head dimension) of a transformers config."""
    heads = getattr(config, "num_attention_heads", 1) or 1
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) or 0) // heads
    return heads, kv_heads, head_dim


def _max_positions(config) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class HFModel(SlotCacheModel):
    """Wrap a causal LM (eval mode, inference only). ``tokenizer`` is optional, for text I/O."""

    def __init__(self, model, tokenizer=None, name: str | None = None, info: ModelInfo | None = None):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        if not hasattr(model, "config") or not callable(model):
            raise SpecboundError("HFModel needs a transformers causal-LM model instance")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or type(model).__name__
        self.vocab_size = _output_size(model)
        self.dtype = next(iter(model.parameters()), torch.zeros(())).dtype
        self.info = info or ModelInfo(backend="hf", kernels="eager", max_positions=_max_positions(model.config))
        self.reset()

    # ------------------------------------------------------------------ cache
    def cache_bytes_per_slot(self) -> int:
        """Keys and values of every layer for one cached token."""
        _, kv_heads, head_dim = attention_shape(self.model.config)
        layers = getattr(self.model.config, "num_hidden_layers", 0) or 0
        return int(2 * layers * kv_heads * head_dim * self._cache_dtype().itemsize)

    def _cache_dtype(self) -> torch.dtype:
        return self.dtype

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.slots = CacheTree(self.name)

    def _cache_tensors(self):
        for layer in self.cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is not None and keys.numel():
                yield layer

    def crop(self, length: int) -> None:
        old = self.slots.length
        length = self.slots.crop(length)
        if length < old:
            self.cache.crop(length - old)        # transformers 5: negative = slots to remove

    def keep_path(self, base_length: int, path) -> None:
        old = self.slots.length
        kept = self.slots.keep_path(base_length, path)
        tail = kept[base_length:]
        if tail and tail != list(range(base_length, base_length + len(tail))):
            index = torch.as_tensor(tail, dtype=torch.long)
            dst = slice(base_length, base_length + len(tail))
            with torch.inference_mode():     # move the kept slots next to the committed chain
                for layer in self._cache_tensors():
                    if getattr(layer, "is_sliding", False):
                        raise SpecboundError(f"{self.name}: tree decoding does not support sliding-window caches")
                    layer.keys[..., dst, :] = layer.keys.index_select(-2, index)
                    layer.values[..., dst, :] = layer.values.index_select(-2, index)
        if len(kept) < old:
            self.cache.crop(len(kept) - old)

    # ------------------------------------------------------------------ forwards
    def _check_positions(self, positions: list[int]) -> None:
        limit = self.info.max_positions
        if limit is not None and positions and max(positions) >= limit:
            raise SpecboundError(
                f"{self.name}: position {max(positions)} is beyond the model's context of {limit} tokens "
                "(shorten the prompt or --max-new-tokens)"
            )

    def _run(self, tokens, positions, mask, keep_logits) -> torch.Tensor:
        kwargs = {"logits_to_keep": keep_logits} if keep_logits else {}
        with torch.inference_mode():
            out = self.model(input_ids=tokens, attention_mask=mask,
                             position_ids=torch.as_tensor([positions], dtype=torch.long),
                             cache=self.cache, use_cache=True, **kwargs)
        return out.logits.float()

    def forward(self, tokens: torch.Tensor, keep_logits: int | None = None) -> torch.Tensor:
        """Read a chain; ``keep_logits`` = m returns only the last m positions' logits (prefill: 1)."""
        tokens = self.check_tokens(tokens)
        k = tokens.shape[1]
        if not self.slots.is_chain:
            logits = self.forward_tree(tokens, self.slots.chain_parents(k))
            return logits[:, -keep_logits:] if keep_logits else logits
        start = self.slots.length
        positions = list(range(start, start + k))
        self._check_positions(positions)
        logits = self._run(tokens, positions, None, keep_logits)
        self.slots.append(self.slots.chain_parents(k), extend_chain=True)
        return logits

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        tokens = self.check_tokens(tokens)
        parents = self.slots.check_parents(parents)
        if tokens.shape[1] != len(parents):
            raise SpecboundError(f"{self.name}: {tokens.shape[1]} tree tokens but {len(parents)} parents")
        visible = self.slots.ancestors_mask(parents)
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
        base = self.slots.length
        positions = [0 if p < 0 else self.slots.position(p) + 1 if p < base else None for p in parents]
        for i, p in enumerate(parents):
            if positions[i] is None:
                positions[i] = positions[p - base] + 1
        self._check_positions(positions)
        logits = self._run(tokens, positions, mask[None, None], None)
        self.slots.append(parents)
        return logits
