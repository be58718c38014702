"""Token ids with a special meaning for decoding: the ids that end a sample (ONE finder for every caller)."""
from __future__ import annotations

__all__ = ["END_OF_TURN_TOKENS", "stop_token_ids"]

#: Chat end-of-turn / end-of-text tokens of the model families we ship or test (Qwen2.5, SmolLM2, Llama 3).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


def _ids(value) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple, set)) else [value]
    return [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def stop_token_ids(model) -> list[int]:
    """Sorted ids that end a sample of ``model``: the generation config's ``eos_token_id`` (an id or a
    list), the tokenizer's ``eos_token_id`` and the chat end-of-turn tokens of
    :data:`END_OF_TURN_TOKENS` that the tokenizer knows. ``[]`` for a model without either.

    Used by ``specbound generate`` (unless ``--ignore-eos``) and by every experiment that samples
    until the end of a response, so they all stop at the same tokens.
    """
    ids: set[int] = set()
    config = getattr(getattr(model, "model", None), "generation_config", None)
    ids.update(_ids(getattr(config, "eos_token_id", None)))
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return sorted(ids)
    ids.update(_ids(getattr(tokenizer, "eos_token_id", None)))
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is not None:
        unknown = getattr(tokenizer, "unk_token_id", None)
        for text in END_OF_TURN_TOKENS:
            try:
                tid = convert(text)
            except (KeyError, ValueError, TypeError):   # tokenizers differ in how they report unknown tokens
                continue
            if isinstance(tid, int) and tid >= 0 and tid != unknown:
                ids.add(tid)
    vocab = getattr(model, "vocab_size", None)
    return sorted(i for i in ids if vocab is None or i < vocab)
