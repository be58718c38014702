"""Build a tiny random llama-architecture GGUF in code (no download), for the llama.cpp backend tests.

The model is a 2-layer llama (hidden 64, 4 heads, 2 KV heads) with a minimal SentencePiece-style
vocabulary in the metadata: <unk>, <s>, </s>, the 256 byte-fallback tokens <0x00>..<0xFF>, "▁",
the lower-case letters and a few words, so llama.cpp can tokenize and detokenize any text.
Weights are Gaussian with a fixed seed; the output head is scaled so next-token laws are neither
uniform nor one-hot (top-4 mass well spread), which the statistical tests need.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁it", "er", "in", "on", "an", "th", "he"]


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf.TokenType values) of the minimal SPM vocabulary."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256                         # UNKNOWN, CONTROL, CONTROL, BYTE...
    scores = [0.0] * len(tokens)
    pieces = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [".", ",", "!", "?"] + WORDS
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)                                   # NORMAL
        scores.append(-float(i) if len(piece) == 1 else 10.0 - 0.1 * i)   # merges prefer the words
    return tokens, scores, types


def write_tiny_llama_gguf(path, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                          kv_heads: int = 2, ffn: int = 128, context: int = 512, logit_scale: float = 3.0,
                          file_type: str = "f32", name: str = "tiny-llama", noise: float = 0.0,
                          noise_seed: int = 1) -> Path:
    """Write the tiny model to ``path`` (a new .gguf file) and return the path.

    ``file_type`` is "f32" or "f16" (2-D weights in half precision, norms in f32). ``noise`` > 0 adds
    Gaussian noise (relative scale, seed ``noise_seed``) to every weight of the ``seed`` model: a
    draft-like model that agrees with the target often but not always.
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)
    tokens, scores, types = tiny_vocab()
    vocab = len(tokens)
    head_dim = hidden // heads
    wtype = {"f32": np.float32, "f16": np.float16}[file_type]

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if file_type == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)

    def dense(out_dim: int, in_dim: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out_dim, in_dim)) * scale / np.sqrt(in_dim)).astype(wtype)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)

    def add(name: str, array: np.ndarray) -> None:
        if noise > 0:
            array = array.astype(np.float64)
            array = array + noise * array.std() * noise_rng.standard_normal(array.shape)
        writer.add_tensor(name, array.astype(np.float32 if array.ndim == 1 else wtype))

    # numpy shape (rows, cols) = (output features, input features); GGUF stores the reverse order
    add("token_embd.weight", rng.standard_normal((vocab, hidden)).astype(wtype))
    for b in range(layers):
        add(f"blk.{b}.attn_norm.weight", norm())
        add(f"blk.{b}.attn_q.weight", dense(hidden, hidden, 2.0))
        add(f"blk.{b}.attn_k.weight", dense(kv_heads * head_dim, hidden, 2.0))
        add(f"blk.{b}.attn_v.weight", dense(kv_heads * head_dim, hidden))
        add(f"blk.{b}.attn_output.weight", dense(hidden, hidden))
        add(f"blk.{b}.ffn_norm.weight", norm())
        add(f"blk.{b}.ffn_gate.weight", dense(ffn, hidden))
        add(f"blk.{b}.ffn_up.weight", dense(ffn, hidden))
        add(f"blk.{b}.ffn_down.weight", dense(hidden, ffn))
    add("output_norm.weight", norm())
    add("output.weight", dense(vocab, hidden, logit_scale))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":                                # pragma: no cover - manual use
    import sys

    print(write_tiny_llama_gguf(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-llama.gguf"))
