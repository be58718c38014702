"""Reads through torch.compile (models/static.py ``compiled_layer_step``) against eager reads of the same
int8 modules: the same logits bit for bit over random chain reads, tree reads, keep_path and crop (fused
q/k/v and gate/up, outlier channels, float64 attention — the real target's form); greedy speculative
decoding of a compiled target equals the eager target's own greedy decoding; ``--compile`` is refused
for targets it does not apply to before a model loads."""
import pytest
import torch

from helpers import tiny_transformer
from specbound.decoding import autoregressive_decode, speculative_decode
from specbound.errors import SpecboundError
from specbound.models.int8 import (activation_absmax, fuse_shared_inputs, int8_available, make_batch_invariant,
                                   quantize_int8)
from specbound.models.static import StaticCacheHFModel
from test_static_cache import VOCAB, _drive

pytestmark = pytest.mark.skipif(not int8_available(), reason="fbgemm int8 kernels not available")


def _int8_target(seed: int, outliers: int = 3):
    """A tiny Qwen2 quantised as the real target is: outlier channels apart, q/k/v and gate/up fused,
    float parts batch-invariant."""
    model = tiny_transformer(seed, vocab=VOCAB)
    calibration = torch.randint(0, VOCAB, (1, 32), generator=torch.Generator().manual_seed(seed))
    absmax = activation_absmax(model, [calibration])
    model = make_batch_invariant(quantize_int8(model, absmax=absmax, outliers=outliers))
    assert fuse_shared_inputs(model) == 2 * len(model.model.layers)
    return model


@pytest.fixture(scope="module")
def target():
    return _int8_target(4)


def test_compiled_reads_are_the_eager_reads_bit_for_bit(target):
    from torch._dynamo.utils import counters

    eager = StaticCacheHFModel(target, name="eager")
    compiled = eager.fork()
    compiled.compiled = True
    frames = counters["frames"]["ok"]
    assert _drive([eager, compiled], seed=0, steps=40) == 0.0
    assert counters["frames"]["ok"] > frames          # the compiled step did run (and compiled a graph)
    assert not counters["graph_break"]                # one graph per layer read, nothing left to eager


def test_greedy_sd_of_a_compiled_target_is_the_eager_targets_greedy_decoding(target):
    draft = quantize_int8(tiny_transformer(5, vocab=VOCAB))
    eager = StaticCacheHFModel(target, name="eager")
    compiled = eager.fork()
    compiled.compiled = True
    for seed in range(2):
        prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(seed))
        ref = autoregressive_decode(eager, prompt, 24, temperature=0.0).tokens
        assert autoregressive_decode(compiled, prompt, 24, temperature=0.0).tokens == ref
        assert speculative_decode(compiled, StaticCacheHFModel(draft, name="draft"), prompt, 24, temperature=0.0,
                                  gamma=3, seed=seed).tokens == ref


def test_compile_needs_the_int8_target_and_says_so_before_loading(tmp_path):
    from specbound.models.loading import load_model

    with pytest.raises(SpecboundError, match="int8"):
        load_model(tmp_path / "no-such-model", precision="fp32", compiled=True)


def test_bench_compiled_twin_decodes_as_the_eager_target(target):
    from dataclasses import replace

    from specbound.decoding import SamplingConfig
    from specbound.experiments.bench import compiled_twin, run_method

    eager = StaticCacheHFModel(target, name="eager")
    eager.info = replace(eager.info, kernels="int8-fbgemm, static KV cache")
    models = {"target": eager, "target_compiled": compiled_twin(eager)}
    assert models["target_compiled"].compiled and "torch.compile" in models["target_compiled"].info.kernels
    prompt = torch.tensor([[3, 17, 5, 9]])
    plain, _ = run_method("specbound-plain", models, prompt, 16, SamplingConfig(0.0), 0)
    twin, run = run_method("specbound-plain-compiled", models, prompt, 16, SamplingConfig(0.0), 0)
    assert twin == plain and run.decode_tokens_per_second > 0
    with pytest.raises(SpecboundError, match="int8"):
        compiled_twin(StaticCacheHFModel(tiny_transformer(6, vocab=VOCAB), name="fp32"))


def test_a_failed_compile_leaves_eager_reads_with_a_warning(target, monkeypatch):
    import specbound.models.static as static

    def broken():
        def step(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return step

    monkeypatch.setattr(static, "compiled_layer_step", broken)
    model = StaticCacheHFModel(target, name="eager")
    model.compiled = True
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        assert model.compile_now() is None
    assert not model.compiled
    model.prefill([1, 2, 3])
    assert model.forward(torch.tensor([[4]])).shape[-1] == VOCAB


def test_compile_is_on_for_the_int8_target_unless_refused():
    from specbound.options import resolve_compile

    assert resolve_compile(None, "int8") and not resolve_compile(None, "fp32")
    assert not resolve_compile(False, "int8") and resolve_compile(True, "int8")
    with pytest.raises(SpecboundError, match="int8"):
        resolve_compile(True, "fp32")
