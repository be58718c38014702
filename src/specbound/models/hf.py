"""Any Hugging Face ``AutoModelForCausalLM``, unmodified, behind the :class:`LanguageModel` protocol.

The KV cache is a ``transformers.DynamicCache``. Rolling back after a rejection crops every layer
to the committed length, so no stale entry survives. A draft tree is scored in one forward with a
4-D attention mask (each node sees the cache and its ancestors) and per-node position ids; keeping
the accepted path gathers those entries along the sequence axis. No modeling file is forked.
"""
from __future__ import annotations

import os

import torch

from ..errors import SpecboundError
from .base import LanguageModel, tree_depths

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

__all__ = ["HFModel"]


def _output_size(model) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.vocab_size)


class HFModel(LanguageModel):
    """Wrap a causal LM (eval mode, inference only). ``tokenizer`` is optional, for text I/O."""

    def __init__(self, model, tokenizer=None, name: str | None = None, min_forward_tokens: int = 1):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        if not hasattr(model, "config") or not callable(model):
            raise SpecboundError("HFModel needs a transformers causal-LM model instance")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or type(model).__name__
        self.vocab_size = _output_size(model)
        self.dtype = next(model.parameters()).dtype
        # Some kernels (int8 dynamic quantisation on x86) have a slow path for one row only: shorter
        # forwards are padded with copies of their last token, whose cache entries are then cropped.
        self.min_forward_tokens = int(min_forward_tokens)
        self.reset()

    # ------------------------------------------------------------------ cache
    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self._length = 0

    @property
    def cache_length(self) -> int:
        return self._length

    def crop(self, length: int) -> None:
        length = self._check_crop(length)
        if length < self._length:
            self.cache.crop(length - self._length)        # transformers 5: negative = tokens to remove
            self._length = length

    def keep_path(self, base_length: int, path: list[int]) -> None:
        base_length = self._check_crop(base_length)
        keep = torch.cat([torch.arange(base_length), base_length + torch.as_tensor(path, dtype=torch.long)])
        if path and (min(path) < 0 or base_length + max(path) >= self._length):
            raise SpecboundError(f"{self.name}: path {path} is outside the scored tree")
        for layer in self.cache.layers:
            if getattr(layer, "is_sliding", False):
                raise SpecboundError(f"{self.name}: tree decoding does not support sliding-window caches")
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        self._length = len(keep)

    # ------------------------------------------------------------------ forwards
    def _run(self, tokens: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.ndim != 2:
            raise SpecboundError(f"{self.name}.forward expects tokens [batch, k], got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise SpecboundError(f"{self.name}: token ids outside [0, {self.vocab_size})")
        batch = tokens.shape[0]
        with torch.inference_mode():
            out = self.model(input_ids=tokens, attention_mask=mask,
                             position_ids=position_ids.expand(batch, -1),
                             cache=self.cache, use_cache=True)
        self._length += tokens.shape[1]
        return out.logits.float()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        k = tokens.shape[-1]
        pad = self.min_forward_tokens - k if k else 0
        if pad > 0:
            tokens = torch.cat([tokens, tokens[:, -1:].expand(-1, pad)], dim=1)
        positions = torch.arange(self._length, self._length + k + max(pad, 0)).unsqueeze(0)
        logits = self._run(tokens, positions, None)
        if pad > 0:
            self.crop(self._length - pad)
            logits = logits[:, :k]
        return logits

    def forward_tree(self, tokens: torch.Tensor, parents) -> torch.Tensor:
        depths = tree_depths(parents)
        n = len(depths)
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        if tokens.shape[-1] != n:
            raise SpecboundError(f"{self.name}: {tokens.shape[-1]} tree tokens but {n} parents")
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(parents):
            allowed[i, i] = True
            if parent >= 0:
                allowed[i] |= allowed[parent]
        visible = torch.cat([torch.ones(n, self._length, dtype=torch.bool), allowed], dim=1)
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
        positions = (self._length - 1 + torch.tensor(depths, dtype=torch.long)).unsqueeze(0)
        return self._run(tokens, positions, mask[None, None].expand(tokens.shape[0], 1, -1, -1))
