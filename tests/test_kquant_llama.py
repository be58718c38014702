"""llama-architecture GGUF files on the K-quant kernel: llama's converter permutes the q/k rows of each
head for llama.cpp's rotary layout, and the K-quant target puts them back (unpermute_rows). Checked
against llama.cpp itself on a K-quant file its own quantiser made (Q4_K_M from a tiny llama model
written in code): the two read the same next token at almost every position (their activations are
rounded differently: int8 per 32 inputs here, Q8_K per 256 there), and without the un-permutation
they mostly do not. Other architectures are refused by name."""
import ctypes

import numpy as np
import pytest
import torch

from gguf_tiny import tiny_vocab, write_tiny_llama_gguf
from specbound.errors import SpecboundError
from specbound.models import kquant
from specbound.models.kquant import kernel_available, load_gguf_kquant, unpermute_rows

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the K-quant kernel did not build (no C++ compiler)")

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


def test_unpermute_inverts_the_converters_permutation():
    """The converter's permutation (per head: reshape(2, d/2).swapaxes) written here from its
    definition, then undone; any payload per row moves with its row."""
    heads, d, cols = 3, 8, 5
    hf = np.arange(heads * d * cols).reshape(heads * d, cols)
    converted = hf.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(hf.shape)
    assert not np.array_equal(converted, hf)
    np.testing.assert_array_equal(unpermute_rows(converted, heads), hf)
    with pytest.raises(SpecboundError, match="un-permute"):
        unpermute_rows(hf[:10], heads)


@pytest.fixture(scope="module")
def q4_k_m_file(tmp_path_factory):
    from specbound.models.llamacpp import load_llama_cpp

    try:
        lib = load_llama_cpp()
    except Exception:  # noqa: BLE001 - the binding is optional
        pytest.skip("needs llama-cpp-python (make setup-llamacpp)")
    root = tmp_path_factory.mktemp("llama-kq")
    source = write_tiny_llama_gguf(root / "f32.gguf", hidden=256, heads=4, kv_heads=2, ffn=512, layers=2)
    out = root / "q4_k_m.gguf"
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = LLAMA_FTYPE_MOSTLY_Q4_K_M, True, 1
    assert lib.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


def next_token_agreement(path, ids) -> tuple[float, float]:
    """Share of positions where the K-quant target and llama.cpp pick the same next token, and the
    largest logit difference, reading ``ids`` teacher-forced."""
    from specbound.models.llamacpp import LlamaCppModel

    model, _ = load_gguf_kquant(path, kernel="portable")
    with torch.no_grad():
        ours = model(ids).logits[0].float()
    theirs = torch.as_tensor(np.asarray(LlamaCppModel(path).forward(ids))).float().reshape(ours.shape)
    return float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()), float((ours - theirs).abs().max())


@pytest.mark.llamacpp
def test_a_llama_k_quant_file_reads_as_llama_cpp_reads_it(q4_k_m_file, monkeypatch):
    import gguf

    kinds = {t.tensor_type.name for t in gguf.GGUFReader(str(q4_k_m_file)).tensors}
    assert kinds == {"Q4_K", "Q6_K", "F32"}                  # llama.cpp's own Q4_K_M mix
    vocab = len(tiny_vocab()[0])
    ids = torch.randint(3, vocab, (1, 64), generator=torch.Generator().manual_seed(0))
    agree, diff = next_token_agreement(q4_k_m_file, ids)
    assert agree >= 0.85 and diff < 1.5                      # measured: 0.95 and 0.46 (logits up to ~13)
    monkeypatch.setattr(kquant, "_PERMUTED", {})             # the rows left as the converter wrote them
    wrong, wrong_diff = next_token_agreement(q4_k_m_file, ids)
    assert wrong <= 0.5 and wrong_diff > 3.0                 # measured: 0.20 and 11


def test_another_architecture_is_refused_by_name(tmp_path):
    import gguf

    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_tensor("token_embd.weight", np.zeros((16, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecboundError, match="architecture 'phi3'; the K-quant target reads"):
        load_gguf_kquant(path)
