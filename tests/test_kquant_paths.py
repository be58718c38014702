"""The K-quant kernel's paths (kquant_core.cpp): every path this CPU runs gives the portable path's bits —
random blocks, rounding ties, zero blocks, outliers, and the extremes where AVX2's int16 sums come
closest to saturating; the path is chosen from what the CPU supports and can be forced by
SPECBOUND_KQUANT_PATH (refused with a clear error where the CPU lacks it); and the ARM paths, cross-compiled
into a stand-alone driver of the same core and run under qemu-aarch64, give the x86 portable path's bits
(skipped where the cross-compiler or qemu is not installed: Debian's g++-aarch64-linux-gnu, qemu-user)."""
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specbound.errors import SpecboundError
from specbound.models import kquant
from specbound.models.kquant import KQuantLinear, kernel_available, pack_q4_k, pack_q6_k

from test_kquant import packed, random_blocks

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the K-quant kernel did not build (no C++ compiler)")

MODELS = Path(kquant.__file__).parent
DRIVER = Path(__file__).parent / "native" / "kquant_driver.cpp"
FAST_PATHS = [p for p in ("avx2", "avxvnni", "avx512vnni") if kernel_available() and p in kquant.supported_paths()]


def hard_inputs(cols: int, seed: int) -> torch.Tensor:
    """Rows that probe the activation rounding: random scales, exact ties (v * 127 / amax = n + 0.5
    rounds to even), an all-zero 32-input block, a linear ramp, large outliers, and 11 rows so that a
    read spans a full pass of 8 rows and a partial one."""
    x = torch.randn(7, cols, generator=torch.Generator().manual_seed(seed)) * 3
    x[1] *= 50.0
    ties = torch.zeros(4, cols)
    ties[0, :32] = torch.arange(32) - 15.5
    ties[0, 31] = 127.0                          # amax 127: v * inv = v, so the .5 values are ties
    ties[1, 64:96] = -1.0
    ties[2] = torch.linspace(-4, 4, cols)
    ties[3, ::7] = 1e4
    return torch.cat([x, ties])


@pytest.mark.parametrize("path", FAST_PATHS)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_every_path_gives_the_portable_bits(kind, path):
    p = packed(kind, rows=64, cols=1024, seed=8)
    x = hard_inputs(1024, seed=9)
    expected = KQuantLinear(p, kernel="portable")(x)
    for k in (1, 2, 3, 8, 11):                   # every row count a pass can hold, and two passes
        torch.testing.assert_close(KQuantLinear(p, kernel=path)(x[:k]), expected[:k], rtol=0, atol=0)


def extreme_blocks(kind: str, rows: int, cols: int) -> np.ndarray:
    """GGUF blocks whose every code is the largest (Q4_K 15, Q6_K 63), with small positive scales."""
    raw = random_blocks(kind, rows, cols, seed=20).reshape(rows, cols // 256, -1)
    if kind == "Q4_K":
        raw[..., 16:] = 0xFF                     # qs: both nibbles 15
    else:
        raw[..., :192] = 0xFF                    # ql and qh: every code 63
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("path", FAST_PATHS)
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_int16_sums_do_not_saturate_at_the_extremes(kind, path):
    """Largest codes times activations all +127 or all -127 (rows of one sign, amax = every value), and
    alternating signs: the AVX2 kernel's int16 sums reach 16 * 15 * 127 = 30480 (Q4_K) and
    4 * 63 * 127 = 32004 (Q6_K) here, next to 32767; a saturating or wrapping sum would differ from the
    portable path's exact int32 sums by thousands of code steps."""
    raw = extreme_blocks(kind, 32, 512)
    p = pack_q4_k(raw) if kind == "Q4_K" else pack_q6_k(raw)
    codes = kquant.q4_k_codes(raw)[0] if kind == "Q4_K" else kquant.q6_k_codes(raw)[0]
    assert codes.min() == codes.max() == (15 if kind == "Q4_K" else 63)
    x = torch.ones(4, 512)
    x[1] = -1.0
    x[2, 1::2] = -1.0
    x[3] = -x[2]
    expected = KQuantLinear(p, kernel="portable")(x)
    torch.testing.assert_close(KQuantLinear(p, kernel=path)(x), expected, rtol=0, atol=0)
    # the inputs reach the edge: the largest int16 sum the AVX2 kernel forms (one lane's first int16 of
    # vpmaddubsw pairs, over the inputs it adds: Q4_K 16 of a group's 32, Q6_K 4 of the first two chunks)
    xq = np.rint(x.numpy() * 127).astype(np.int64)                 # amax 1 in every block: codes +-127
    first = [8 * ch + half + j for ch in range(4) for half in (0, 4) for j in (0, 1)] if kind == "Q4_K" \
        else [4 * ch + j for ch in (0, 1) for j in (0, 1)]
    largest = np.abs(xq[:, first] @ codes[:, first].T.astype(np.int64)).max()
    assert largest == (30480 if kind == "Q4_K" else 32004)


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_the_path_follows_the_cpu_and_can_be_forced():
    supported = kquant.supported_paths()
    assert "portable" in supported and kquant.kernel_path() in supported
    order = ["avx512vnni", "avxvnni", "avx2", "neon-i8mm", "neon", "portable"]
    if not os.environ.get(kquant.PATH_VARIABLE):
        assert kquant.kernel_path() == next(p for p in order if p in supported)
    forced = run_python("from specbound.models import kquant; print(kquant.kernel_path())",
                        SPECBOUND_KQUANT_PATH="portable")
    assert forced.returncode == 0 and forced.stdout.strip() == "portable"


def test_a_forced_path_the_cpu_lacks_or_does_not_know_is_refused_clearly():
    lacking = next(p for p in kquant.kernel_paths() if p not in kquant.supported_paths())
    code = "from specbound.models import kquant; kquant.kernel_path()"
    out = run_python(code, SPECBOUND_KQUANT_PATH=lacking)
    assert out.returncode != 0 and f"SPECBOUND_KQUANT_PATH={lacking}" in out.stderr
    assert "does not run on this CPU" in out.stderr
    out = run_python(code, SPECBOUND_KQUANT_PATH="sse9")
    assert out.returncode != 0 and "unknown K-quant kernel path 'sse9'" in out.stderr
    with pytest.raises(SpecboundError, match="does not run on this CPU"):
        KQuantLinear(packed("Q4_K", rows=16, cols=256, seed=1), kernel=lacking)


# ------------------------------------------------------------------ ARM, under an emulator
CROSS = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")


@pytest.fixture(scope="module")
def arm_driver(tmp_path_factory):
    if CROSS is None or QEMU is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user)")
    out = tmp_path_factory.mktemp("arm") / "kquant_driver"
    subprocess.run([CROSS, "-std=c++17", "-O3", "-ffp-contract=off", "-static", f"-I{MODELS}", str(DRIVER),
                    str(MODELS / "kquant_core.cpp"), "-o", str(out)], check=True, capture_output=True, timeout=600)
    return out


def run_driver(driver: Path, cpu: str, p: dict, x: torch.Tensor, tmp_path: Path) -> dict[str, np.ndarray]:
    """y of every path the emulated CPU runs, by name (the driver's file format: kquant_driver.cpp)."""
    k, c = x.shape
    blocks = p["codes"].shape[0]
    with open(tmp_path / "in.bin", "wb") as f:
        f.write(np.array([p["kind"], blocks, c, k], dtype=np.int64).tobytes())
        for name in ("codes", "sc", "mn", "d", "dmin"):
            if p.get(name) is not None:
                f.write(np.ascontiguousarray(p[name]).tobytes())
        f.write(np.ascontiguousarray(x.numpy(), dtype=np.float32).tobytes())
    subprocess.run([QEMU, "-cpu", cpu, str(driver), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                   check=True, timeout=600)
    data, off, ys = (tmp_path / "out.bin").read_bytes(), 0, {}
    while off < len(data):
        (n,) = struct.unpack_from("<q", data, off)
        name = data[off + 8:off + 8 + n].decode()
        off += 8 + n
        ys[name] = np.frombuffer(data, dtype=np.float32, count=k * blocks * 16, offset=off).reshape(k, blocks * 16)
        off += k * blocks * 16 * 4
    return ys


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_arm_paths_give_the_portable_bits_under_qemu(arm_driver, kind, tmp_path):
    """-cpu max has dot product and i8mm; cortex-a76 dot product only; cortex-a53 neither, so the
    driver must find exactly those paths (the hardware-capability check) and each must give the bits
    of the x86 portable path on the same inputs (the ARM portable build included)."""
    p = packed(kind, rows=64, cols=1024, seed=8)
    x = hard_inputs(1024, seed=9)
    expected = KQuantLinear(p, kernel="portable")(x).numpy()
    for cpu, paths in (("max", {"portable", "neon", "neon-i8mm"}), ("cortex-a76", {"portable", "neon"}),
                       ("cortex-a53", {"portable"})):
        ys = run_driver(arm_driver, cpu, p, x, tmp_path)
        assert set(ys) == paths, cpu
        for name, y in ys.items():
            np.testing.assert_array_equal(y.view(np.uint32), expected.view(np.uint32), err_msg=f"{cpu} {name}")


def test_the_arm_comparison_fails_on_a_wrong_code_order(arm_driver, tmp_path):
    """The check's power: the driver fed codes with each lane's bytes reversed gives other outputs."""
    p = packed("Q4_K", rows=32, cols=512, seed=4)
    codes = p["codes"]
    wrong = dict(p, codes=np.ascontiguousarray(codes.reshape(*codes.shape[:2], -1, 16, 4)[..., ::-1]
                                               .reshape(codes.shape)))
    x = hard_inputs(512, seed=5)
    expected = KQuantLinear(p, kernel="portable")(x).numpy()
    ys = run_driver(arm_driver, "max", wrong, x, tmp_path)
    assert not np.array_equal(ys["neon-i8mm"], expected) and not np.array_equal(ys["neon"], expected)
