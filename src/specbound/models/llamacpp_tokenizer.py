"""Text in and out of a GGUF model through llama.cpp's own tokenizer, with a Hugging Face-like surface.

:class:`LlamaCppTokenizer` wraps the tokenizer stored in the GGUF (``llama_tokenize`` /
``llama_detokenize`` over the model's vocabulary) so that code written for transformers tokenizers
works on a llama.cpp model unchanged: ``encode``, ``decode``, ``__call__`` (``return_tensors="pt"``),
``get_vocab`` and ``convert_tokens_to_ids`` (the stop tokens, ``models/tokens.py``), the special
token ids, and ``apply_chat_template`` (prompt formatting, ``assets/prompts.py``), which renders the
GGUF's Jinja chat template in a sandboxed jinja2 environment the way transformers does.

:class:`specbound.models.llamacpp.LlamaCppModel` builds one for itself (``model.tokenizer``); the
tokenizer borrows that model's llama.cpp library and vocabulary and frees nothing.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import ModelNotAvailable, SpecboundError

if TYPE_CHECKING:
    from .llamacpp import LlamaCppModel

__all__ = ["LlamaCppTokenizer"]


class _Encoding(dict):
    """What ``tokenizer(text)`` returns: ``.input_ids`` and ``.attention_mask`` (also as keys)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class LlamaCppTokenizer:
    """Hugging Face-like text I/O over llama.cpp's own tokenizer (the one inside the GGUF)."""

    def __init__(self, model: LlamaCppModel):
        lib = model._lib
        self._lib, self._model, self._vocab = lib, model, model._vocab
        self.vocab_size = model.vocab_size
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))

        def special(token: int):
            return None if token is None or token < 0 else int(token)

        self.bos_token_id = special(lib.llama_vocab_bos(self._vocab))
        self.eos_token_id = special(lib.llama_vocab_eos(self._vocab))
        self.eot_token_id = special(lib.llama_vocab_eot(self._vocab))
        self.pad_token_id = special(lib.llama_vocab_pad(self._vocab))
        self.bos_token = self._text(self.bos_token_id)
        self.eos_token = self._text(self.eos_token_id)
        template = lib.llama_model_chat_template(model._model, None)
        self.chat_template = template.decode("utf-8", "replace") if template else None
        self._vocab_dict: dict[str, int] | None = None

    def _text(self, token):
        if token is None:
            return None
        raw = self._lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw is not None else None

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS added when the model asks for it and ``add_special_tokens``)."""
        if not isinstance(text, str):
            raise SpecboundError(f"encode expects a string, got {type(text).__name__}")
        raw = text.encode("utf-8")
        lib = self._lib
        capacity = len(raw) + 8
        buf = (lib.llama_token * capacity)()
        n = lib.llama_tokenize(self._vocab, raw, len(raw), buf, capacity, add_special_tokens, parse_special)
        if n < 0:
            capacity = -n
            buf = (lib.llama_token * capacity)()
            n = lib.llama_tokenize(self._vocab, raw, len(raw), buf, capacity, add_special_tokens, parse_special)
        if n < 0:
            raise SpecboundError(f"{self._model.name}: llama.cpp could not tokenize the text")
        return list(buf[:n])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        ids = [int(t) for t in (ids if isinstance(ids, (list, tuple)) else np.asarray(ids).reshape(-1))]
        if not ids:
            return ""
        lib = self._lib
        arr = (lib.llama_token * len(ids))(*ids)
        capacity = 16 * len(ids) + 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(capacity)
            n = lib.llama_detokenize(self._vocab, arr, len(ids), buf, capacity, False, not skip_special_tokens)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            capacity = -n + 1
        raise SpecboundError(f"{self._model.name}: llama.cpp could not detokenize {len(ids)} tokens")

    def __call__(self, text, return_tensors: str | None = None, add_special_tokens: bool = True, **_ignored):
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        if return_tensors == "pt":
            if len({len(row) for row in ids}) > 1:
                raise SpecboundError("texts of different token lengths cannot form one tensor (no padding)")
            input_ids = torch.tensor(ids, dtype=torch.long)
            return _Encoding(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        if return_tensors is not None:
            raise SpecboundError(f"return_tensors={return_tensors!r} is not supported (use 'pt' or None)")
        if isinstance(text, str):
            return _Encoding(input_ids=ids[0], attention_mask=[1] * len(ids[0]))
        return _Encoding(input_ids=ids, attention_mask=[[1] * len(row) for row in ids])

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._text(ids)
        return [self._text(int(t)) for t in ids]

    def convert_tokens_to_ids(self, tokens):
        vocab = self.get_vocab()
        if isinstance(tokens, str):
            return vocab.get(tokens)
        return [vocab.get(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        """Piece -> id for the whole vocabulary (built once; ~0.2 s for 150k tokens)."""
        if self._vocab_dict is None:
            vocab = {}
            for i in range(self.vocab_size):
                piece = self._text(i)
                if piece is not None and piece not in vocab:
                    vocab[piece] = i
            self._vocab_dict = vocab
        return dict(self._vocab_dict)

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs):
        """Render the GGUF's Jinja chat template the way transformers does (sandboxed jinja2)."""
        if not self.chat_template:
            raise SpecboundError(f"{self._model.name} has no chat template in its GGUF metadata")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:                       # pragma: no cover - jinja2 comes with transformers
            raise ModelNotAvailable("apply_chat_template needs jinja2 (pip install jinja2)") from None
        import json

        def raise_exception(message):
            raise SpecboundError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals["raise_exception"] = raise_exception
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text
