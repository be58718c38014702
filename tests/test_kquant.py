"""The K-quant GEMM (specbound.models.kquant, kquant.cpp): GGUF Q4_K / Q6_K blocks are unpacked to the
same weights GGUF's own dequantisation gives; the kernel's output is the product of those weights with
activations rounded to int8 per 32 inputs (checked against a float64 reference computed here, within
a bound derived from float32 rounding, and against the unrounded product within the bound the
activation rounding allows); every row is the same whatever the other rows of the call (bit for bit); bad shapes are refused with a
clear error. Every kernel path against the portable one: test_kquant_paths.py."""
import numpy as np
import pytest
import torch

from specbound.errors import SpecboundError
from specbound.models import kquant
from specbound.models.kquant import KQuantLinear, dequantize_packed, kernel_available, pack_q4_k, pack_q6_k

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the K-quant kernel did not build (no C++ compiler)")


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """GGUF rows of random K-quant blocks: random codes and group scales, finite float16 factors."""
    rng = np.random.default_rng(seed)
    n = cols // 256
    size = kquant.Q4_K_BYTES if kind == "Q4_K" else kquant.Q6_K_BYTES
    raw = rng.integers(0, 256, size=(rows, n, size), dtype=np.uint8)
    if kind == "Q4_K":
        raw[..., 0:2] = rng.uniform(1e-3, 4e-3, size=(rows, n, 1)).astype(np.float16).view(np.uint8)
        raw[..., 2:4] = rng.uniform(1e-3, 4e-3, size=(rows, n, 1)).astype(np.float16).view(np.uint8)
    else:
        raw[..., 208:210] = rng.uniform(1e-4, 4e-4, size=(rows, n, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, n * size)


def packed(kind: str, rows: int = 48, cols: int = 512, seed: int = 0) -> dict:
    raw = random_blocks(kind, rows, cols, seed)
    return pack_q4_k(raw) if kind == "Q4_K" else pack_q6_k(raw)


def rounded_activations(x: np.ndarray):
    """The activations the kernel multiplies: each 32 inputs of a row rounded to int8 steps of max|x|/127."""
    k, c = x.shape
    blocks = x.astype(np.float32).reshape(k, c // 32, 32)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    scale = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax > 0, np.rint(blocks * (np.float32(127) / amax)), 0)
    return (q * scale).reshape(k, c).astype(np.float64), np.broadcast_to(scale, blocks.shape).reshape(k, c)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_unpacked_weights_equal_ggufs_own_dequantisation(kind):
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    raw = random_blocks(kind, 32, 512, seed=1)
    expected = quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind))
    got = dequantize_packed(pack_q4_k(raw) if kind == "Q4_K" else pack_q6_k(raw))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_product_of_the_file_weights_and_rounded_activations(kind):
    """Reference in float64 from the dequantised weights: the kernel differs only by float32 rounding
    of its partial sums, bounded here by 1e-5 · sum|x_j w_j| (a few float32 ulps per term, 24 bits ≈
    6e-8, times at most ~100 sequential roundings); and from the unrounded x by at most sum (s_j/2)|w_j|
    (each activation moves by at most half its step s_j) plus the same float slack."""
    p = packed(kind, rows=64, cols=768, seed=2)
    w = dequantize_packed(p).astype(np.float64)
    x = np.random.default_rng(3).standard_normal((5, 768)).astype(np.float32)
    x[1] *= 50.0                                   # rows of very different ranges
    y = KQuantLinear(p)(torch.from_numpy(x)).numpy().astype(np.float64)
    xr, step = rounded_activations(x)
    reference = xr @ w.T
    float_slack = 1e-5 * (np.abs(xr) @ np.abs(w).T)
    assert np.all(np.abs(y - reference) <= float_slack)
    rounding_bound = (step / 2) @ np.abs(w).T
    assert np.all(np.abs(y - x.astype(np.float64) @ w.T) <= rounding_bound + float_slack)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_the_reference_check_fails_on_a_wrong_code_order(kind):
    """The previous test's power: the same codes read with the nibbles / bytes of each lane reversed
    (a plausible packing bug) fall far outside its bound."""
    p = packed(kind, rows=32, cols=512, seed=4)
    w = dequantize_packed(p).astype(np.float64)
    codes = p["codes"]                      # [blocks, groups, parts of 64 bytes] (Q4_K 4 parts, Q6_K 3)
    wrong = dict(p, codes=np.ascontiguousarray(codes.reshape(*codes.shape[:2], -1, 16, 4)[..., ::-1]
                                               .reshape(codes.shape)))
    x = np.random.default_rng(5).standard_normal((3, 512)).astype(np.float32)
    xr, _ = rounded_activations(x)
    y = KQuantLinear(wrong)(torch.from_numpy(x)).numpy().astype(np.float64)
    assert np.any(np.abs(y - xr @ w.T) > 1e-5 * (np.abs(xr) @ np.abs(w).T))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_rows_are_bitwise_batch_invariant(kind):
    """Reads of 1..11 rows (the vector kernel keeps 8 rows in registers, then starts again) give each
    row exactly what it gets alone or among others."""
    layer = KQuantLinear(packed(kind, rows=48, cols=512, seed=6), bias=torch.randn(48))
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(7))
    x[::3] *= 30.0
    together = layer(x)
    for k in (1, 2, 5, 8, 9, 11):
        torch.testing.assert_close(layer(x[:k]), together[:k], rtol=0, atol=0)
    for i in range(11):
        torch.testing.assert_close(layer(x[i:i + 1]), together[i:i + 1], rtol=0, atol=0)
    torch.testing.assert_close(layer(x[3:7]), together[3:7], rtol=0, atol=0)


def test_threads_do_not_change_the_bits():
    p = packed("Q4_K", rows=256, cols=512, seed=10)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(11))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = KQuantLinear(p)(x)
        torch.set_num_threads(2)
        two = KQuantLinear(p)(x)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(one, two, rtol=0, atol=0)


def test_leading_dimensions_and_empty_reads():
    layer = KQuantLinear(packed("Q6_K", rows=32, cols=256, seed=12))
    x = torch.randn(1, 3, 256)
    assert layer(x).shape == (1, 3, 32)
    torch.testing.assert_close(layer(x)[0], layer(x[0]), rtol=0, atol=0)
    assert layer(torch.zeros(0, 256)).shape == (0, 32)
    assert torch.equal(layer(torch.zeros(2, 256)), torch.zeros(2, 32))


def test_bad_shapes_are_refused_clearly():
    with pytest.raises(SpecboundError, match="rows % 16"):
        pack_q4_k(random_blocks("Q4_K", 24, 256, seed=13))
    with pytest.raises(SpecboundError, match="144"):
        pack_q4_k(np.zeros((16, 100), dtype=np.uint8))
    layer = KQuantLinear(packed("Q4_K", rows=16, cols=256, seed=14))
    with pytest.raises(SpecboundError, match="input width 128"):
        layer(torch.randn(2, 128))
