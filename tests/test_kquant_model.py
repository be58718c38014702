"""A K-quant target (specbound.models.kquant) as speculative decoding's target: a tiny Qwen2 model whose
linears and embedding are Q4_K blocks read by the K-quant kernel is batch-invariant as a whole model,
so greedy SD equals its own greedy decoding (HF generate) token for token, SD's output law at T > 0
is its exact law (χ², with a biased sampler that the same test rejects), the static-cache reads and
the fused q/k/v, gate/up calls change no bit, and the loader's name mapping and errors are clear."""
import numpy as np
import pytest
import torch

from helpers import chi_square_pvalue, encode, exact_first_two_law, hf_greedy_tokens, perturbed_copy
from specbound.decoding import SamplingConfig, autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError
from specbound.models.hf import HFModel
from specbound.models.int8 import make_batch_invariant
from specbound.models.kquant import (
    KQuantEmbedding, KQuantLinear, _hf_name, dequantize_packed, fuse_kquant_inputs, kernel_available, quantize_kquant,
    quantize_q4_k,
)
from specbound.models.static import StaticCacheHFModel
from specbound.options import resolve_compile

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the K-quant kernel did not build (no C++ compiler)")
VOCAB = 48 + 16          # a multiple of 16: the output layer's rows come in blocks of 16


def tiny_qwen2(seed: int):
    """A random Qwen2 whose widths the kernel reads (inputs multiples of 256)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.08, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def kquant_pair():
    target = tiny_qwen2(0)
    draft = perturbed_copy(target, 0.3, seed=1)            # the float draft is copied before quantising
    target = make_batch_invariant(quantize_kquant(target))
    return target, draft


def test_q4_k_rounding_is_close_to_the_float_weight():
    """Each weight moves by at most half its group's step (plus float32 slack)."""
    w = torch.randn(32, 512, generator=torch.Generator().manual_seed(0)) * 0.05
    packed = quantize_q4_k(w)
    got = dequantize_packed(packed)
    g = w.numpy().reshape(32, 2, 8, 32)
    step = (g.max(axis=3) - np.minimum(g.min(axis=3), 0)) / 15
    bound = np.repeat(step.reshape(32, 16), 32, axis=1) * (0.5 + 2 / 63) + 1e-6   # + the step's own 6-bit rounding
    assert np.all(np.abs(got - w.numpy()) <= bound)


def test_every_linear_and_the_embedding_are_k_quant(kquant_pair):
    model = kquant_pair[0]
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert sum(isinstance(m, KQuantLinear) for m in model.modules()) == 2 * 7 + 1 + 1
    assert isinstance(model.get_input_embeddings(), KQuantEmbedding)


def test_embedding_rows_equal_the_dequantised_blocks(kquant_pair):
    embedding = kquant_pair[0].get_input_embeddings()
    full = dequantize_packed({"kind": 4, "shape": (VOCAB, 256), **{
        n: getattr(embedding.layer, n).numpy() for n in ("codes", "sc", "mn", "d", "dmin")}})
    ids = torch.tensor([[0, 5, 17, VOCAB - 1, 5]])
    np.testing.assert_array_equal(embedding(ids)[0].numpy(), full[ids[0].numpy()])


def test_whole_model_is_batch_invariant(kquant_pair):
    model = kquant_pair[0]
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model(input_ids=ids).logits[0]
        for n in (1, 2, 7, 24):
            torch.testing.assert_close(model(input_ids=ids[:, :n]).logits[0, -1], full[n - 1], rtol=0, atol=0)


def test_static_cache_and_fused_calls_change_no_bit(kquant_pair):
    model = kquant_pair[0]
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = model(input_ids=ids).logits
    static = StaticCacheHFModel(model, name="tiny-kquant")
    got = torch.cat([static.forward(ids[:, :5]), static.forward(ids[:, 5:6]), static.forward(ids[:, 6:])], dim=1)
    torch.testing.assert_close(got, reference, rtol=0, atol=0)
    import copy

    fused = copy.deepcopy(model)
    assert fuse_kquant_inputs(fused) == 2 * 2
    with torch.inference_mode():
        torch.testing.assert_close(fused(input_ids=ids).logits, reference, rtol=0, atol=0)


@pytest.mark.parametrize("kw", [dict(gamma=3), dict(gamma="auto"), dict(tree=6, tree_drafter="dynamic")])
def test_greedy_sd_of_a_k_quant_target_is_its_own_greedy_decoding(kquant_pair, kw):
    model, draft_model = kquant_pair
    target, draft = StaticCacheHFModel(model, name="tiny-kquant"), HFModel(draft_model, name="tiny-draft")
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(seed))
        ref = hf_greedy_tokens(model, prompt, 24)
        assert autoregressive_decode(target, prompt, 24, temperature=0.0).tokens == ref
        out = speculative_decode(target, draft, prompt, 24, temperature=0.0, seed=seed, **kw)
        assert out.tokens == ref
        accepted += sum(out.metrics.accepted_per_step)
    if kw.get("gamma") != "auto":          # the cost model may rightly decline to draft on a tiny model
        assert accepted > 0


@pytest.mark.montecarlo
@pytest.mark.slow
@pytest.mark.parametrize("config", [SamplingConfig(1.0, top_k=4), SamplingConfig(0.8, top_p=0.8)])
def test_k_quant_target_law_at_positive_temperature(kquant_pair, config):
    """χ² of (x1, x2) from SD against the K-quant target's exact law (1500 runs, p > 1e-3); the same
    test rejects the float draft decoding alone (a sampler whose law is biased away from the target's)."""
    model, draft_model = kquant_pair
    target, draft = HFModel(model, name="tiny-kquant"), HFModel(draft_model, name="tiny-draft")
    prompt = torch.tensor([[3, 17, 5]])
    law = exact_first_two_law(target, prompt, config, VOCAB)
    kw = dict(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    runs = 1500
    sd = np.array([speculative_decode(target, draft, prompt, 2, gamma=2, seed=i, **kw).tokens for i in range(runs)])
    assert chi_square_pvalue(encode(sd, VOCAB), law) > 1e-3
    biased = np.array([autoregressive_decode(draft, prompt, 2, seed=i, **kw).tokens for i in range(runs)])
    assert chi_square_pvalue(encode(biased, VOCAB), law) < 1e-3


def test_gguf_names_map_to_the_llama_module_tree():
    assert _hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert _hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert _hf_name("blk.2.attn_v.bias") == "model.layers.2.self_attn.v_proj.bias"
    assert _hf_name("blk.1.ffn_norm.weight") == "model.layers.1.post_attention_layernorm.weight"
    assert _hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert _hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(SpecboundError, match="unexpected GGUF tensor"):
        _hf_name("blk.0.attn_q_norm.weight")


def test_k_quant_target_options_are_checked_before_loading(tmp_path):
    from specbound.models.loading import load_model

    assert resolve_compile(None, "kquant") is True and resolve_compile(False, "kquant") is False
    with pytest.raises(SpecboundError, match="neither a packaged model nor a .gguf file"):
        load_model(str(tmp_path / "missing.gguf"), progress=False, precision="kquant")
    with pytest.raises(SpecboundError, match="neither a packaged model nor a .gguf file"):
        load_model(str(tmp_path), progress=False, precision="kquant")


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _tiny_parts(seed: int) -> dict:
    """What a GGUF file gives the K-quant loader (kquant._read_gguf), made from a tiny float model."""
    model = tiny_qwen2(seed)
    layers, floats = {}, {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            layers[name] = quantize_q4_k(module.weight)
            if module.bias is not None:
                floats[name + ".bias"] = module.bias.detach().clone()
    layers["model.embed_tokens"] = quantize_q4_k(model.model.embed_tokens.weight)
    floats.update({n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("norm.weight")})
    return {"layers": layers, "floats": floats, "config": model.config, "tokenizer": _tiny_tokenizer()}


def test_the_kept_copy_reads_back_the_same_target(tmp_path):
    from specbound.models.kquant import _build, read_kquant_cache, write_kquant_cache

    source = tmp_path / "model.gguf"
    source.write_bytes(b"stands in for the GGUF file")
    parts = _tiny_parts(2)
    write_kquant_cache(tmp_path / "copy", source, parts)
    again = read_kquant_cache(tmp_path / "copy", source)
    assert again is not None and set(again["layers"]) == set(parts["layers"])
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        torch.testing.assert_close(_build(again, False)(input_ids=ids).logits, _build(parts, False)(input_ids=ids).logits,
                                   rtol=0, atol=0)
    assert parts["tokenizer"].get_vocab().items() <= again["tokenizer"].get_vocab().items()
    # a safetensors file other tools read: the same tensors, bit for bit
    from safetensors.numpy import load_file

    kept = load_file(str(tmp_path / "copy" / "kquant.safetensors"))
    for name, packed in parts["layers"].items():
        assert np.array_equal(kept[f"{name}.codes"], np.asarray(packed["codes"]))
        assert np.array_equal(kept[f"{name}.d"], np.asarray(packed["d"]))
    for name, value in parts["floats"].items():
        assert np.array_equal(kept[name], value.numpy())


def test_a_streamed_copy_is_the_same_copy(tmp_path):
    """A first load streams the GGUF file's tensors into the copy one at a time (``parts["tensors"]``,
    a generator that is consumed once): the files are byte for byte those of the in-memory write."""
    from specbound.models.kquant import write_kquant_cache

    source = tmp_path / "model.gguf"
    source.write_bytes(b"stands in for the GGUF file")
    parts = _tiny_parts(5)
    write_kquant_cache(tmp_path / "whole", source, parts)
    consumed = []

    def stream():
        for name, value in list(parts["layers"].items()) + list(parts["floats"].items()):
            consumed.append(name)
            yield name, value

    write_kquant_cache(tmp_path / "streamed", source, {"config": parts["config"], "tokenizer": parts["tokenizer"],
                                                       "tensors": stream()})
    assert len(consumed) == len(parts["layers"]) + len(parts["floats"])
    for name in ("kquant.safetensors", "kquant.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()


def test_a_damaged_or_foreign_copy_is_not_used(tmp_path, capsys):
    import json
    import os

    from specbound.models.kquant import read_kquant_cache, write_kquant_cache

    source = tmp_path / "model.gguf"
    source.write_bytes(b"stands in for the GGUF file")
    parts = _tiny_parts(4)
    copy_dir = tmp_path / "copy"
    assert read_kquant_cache(copy_dir, source) is None                      # none yet: silent
    write_kquant_cache(copy_dir, source, parts)
    tensors = copy_dir / "kquant.safetensors"
    data = tensors.read_bytes()
    tensors.write_bytes(data[: len(data) // 2])                              # a partial write
    assert read_kquant_cache(copy_dir, source) is None
    assert f"expected {len(data):,} bytes, found {len(data) // 2:,}" in capsys.readouterr().err
    write_kquant_cache(copy_dir, source, parts)
    assert read_kquant_cache(copy_dir, source) is not None                  # as written: usable
    middle = len(data) // 2
    flipped = bytearray(data)
    flipped[middle:middle + 4096] = bytes(b ^ 0xFF for b in flipped[middle:middle + 4096])
    tensors.write_bytes(bytes(flipped))                                      # damaged in place, same size
    assert read_kquant_cache(copy_dir, source) is None
    assert "kquant.safetensors: sha256 is" in capsys.readouterr().err
    write_kquant_cache(copy_dir, source, parts)
    os.utime(source, ns=(1, 1))                                              # the GGUF file changed
    assert read_kquant_cache(copy_dir, source) is None
    assert "another GGUF file" in capsys.readouterr().err
    write_kquant_cache(copy_dir, source, parts)
    desc = json.loads((copy_dir / "kquant.json").read_text())
    (copy_dir / "kquant.json").write_text(json.dumps(dict(desc, format="specbound-kquant-v0")))
    assert read_kquant_cache(copy_dir, source) is None
    (copy_dir / "kquant.json").write_text("{not json")
    assert read_kquant_cache(copy_dir, source) is None
    assert "unreadable" in capsys.readouterr().err


def test_config_and_tokenizer_come_from_the_parse_already_made(tmp_path, monkeypatch):
    """transformers parses a GGUF file's metadata once for its config and once more for its tokenizer
    (~7 s apiece for the packaged target); inside ``parsed_once`` both come from the reader the loader
    opened, and they are the same config and tokenizer as from their own parses."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    from gguf_tiny import write_tiny_llama_gguf
    from specbound.models.kquant import parsed_once

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    parses = []
    original = gguf.GGUFReader

    def counting(*args, **kwargs):
        parses.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)

    def load():
        return (AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name, local_files_only=True),
                AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name, local_files_only=True))

    config, tokenizer = load()
    assert len(parses) == 2                      # what happens without it: the file parsed twice more
    reader = gguf.GGUFReader(str(path))
    parses.clear()
    with parsed_once(path, reader):
        once_config, once_tokenizer = load()
        other = write_tiny_llama_gguf(tmp_path / "other.gguf", seed=3)
        gguf.GGUFReader(str(other))               # another file is parsed as usual
    assert len(parses) == 1 and parses[0][0] == str(other)
    assert gguf.GGUFReader is counting           # put back on leaving
    assert once_config.to_dict() == config.to_dict()
    text = "the cat is in the tree, and it is hot!"
    assert once_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert once_tokenizer.get_vocab() == tokenizer.get_vocab()


def test_assets_list_states_of_a_copy(tmp_path):
    """What ``assets list [--verify]`` reports for a K-quant copy: missing, ok (sizes and what changed),
    verified (every sha256), damaged in place (found by the cheap check once the file changed), and a
    copy of an older format (outdated, not damaged: the next load rebuilds it)."""
    import json

    from specbound.models.kquant import check_kquant_copy, write_kquant_cache

    source = tmp_path / "model.gguf"
    source.write_bytes(b"stands in for the GGUF file")
    copy_dir = tmp_path / "copy"
    assert check_kquant_copy(copy_dir) == ("missing", [])
    write_kquant_cache(copy_dir, source, _tiny_parts(3))
    assert check_kquant_copy(copy_dir) == ("ok", [])
    assert check_kquant_copy(copy_dir, full=True) == ("verified", [])
    tensors = copy_dir / "kquant.safetensors"
    data = bytearray(tensors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tensors.write_bytes(bytes(data))
    state, problems = check_kquant_copy(copy_dir)
    assert state == "damaged" and "kquant.safetensors: sha256 is" in problems[0]
    write_kquant_cache(copy_dir, source, _tiny_parts(3))
    desc = json.loads((copy_dir / "kquant.json").read_text())
    (copy_dir / "kquant.json").write_text(json.dumps(dict(desc, format="specbound-kquant-v2")))
    assert check_kquant_copy(copy_dir)[0] == "outdated"
