"""The GGUF file's own K-quant weights (Q4_K, Q6_K) read by specbound's CPU GEMM (``kquant.cpp``).

The packaged target is a Q4_K_M GGUF file. The int8 target (:mod:`.int8`) re-quantises its dequantised
weights to 8 bits: 1.5 bytes per weight more than the file holds, and every read streams them.
:class:`KQuantLinear` keeps the file's values exactly — 4-bit (Q4_K) or 6-bit (Q6_K) codes with their
group scales — and multiplies them by activations rounded to int8 per row and per 32 inputs (finer
than llama.cpp's 256), with exact integer sums (AVX-512 VNNI) and a fixed order of float operations:

    Q4_K:  w = d · sc_g · q − dmin · m_g        Q6_K:  w = d · sc_g · (q − 32)

so the layer is batch-invariant (a row's output does not depend on the other rows of the call, tested
bit for bit) — what lets a verify pass of k drafted tokens agree with one-token decoding — and its
AVX-512 path equals the portable C++ path bit for bit (tested). The weights equal the fp32 target's
(the dequantised file) exactly; only activations are rounded, as llama.cpp also does (Q8_K).

The kernel is C++ compiled once per machine with the compiler torch uses (``torch.utils.cpp_extension``,
~7 s, cached under ``~/.cache/torch_extensions``); :func:`kernel_available` says whether it built.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import SpecboundError

__all__ = ["KQUANT_KINDS", "KQuantLinear", "dequantize_packed", "kernel_available", "load_kernel", "pack_q4_k",
           "pack_q6_k", "q4_k_codes", "q6_k_codes", "vector_path"]

#: GGUF tensor types this kernel reads, by name: the kernel's ``kind``.
KQUANT_KINDS = {"Q4_K": 4, "Q6_K": 6}
Q4_K_BYTES, Q6_K_BYTES = 144, 210     # bytes per 256-weight super-block in a GGUF file
LANES = 16
_LOCK = threading.Lock()
_STATE: dict = {}


def load_kernel() -> None:
    """Compile (once per machine; cached by torch) and load ``kquant.cpp``; a clear error if it cannot."""
    with _LOCK:
        if "error" in _STATE:
            raise SpecboundError(_STATE["error"])
        if _STATE.get("loaded"):
            return
        try:
            from torch.utils import cpp_extension

            source = Path(__file__).with_name("kquant.cpp")
            cpp_extension.load(name="specbound_kquant", sources=[str(source)],
                               extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"], extra_ldflags=["-fopenmp"],
                               is_python_module=False, verbose=False)
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers: every cause ends the same way
            _STATE["error"] = (f"the K-quant kernel did not build ({type(exc).__name__}: {str(exc)[:300]}); "
                               "it needs a C++ compiler (g++) and torch's headers")
            raise SpecboundError(_STATE["error"]) from None
        _register_fake()
        _STATE["loaded"] = True


def kernel_available() -> bool:
    try:
        load_kernel()
    except SpecboundError:
        return False
    return True


def vector_path() -> bool:
    """Whether the kernel runs its AVX-512 VNNI path on this CPU (else the portable, slower one)."""
    load_kernel()
    return bool(torch.ops.specbound_kq.vector_path())


def _register_fake() -> None:
    if _STATE.get("fake"):
        return
    try:
        @torch.library.register_fake("specbound_kq::gemm")
        def _fake(x, codes, sc, mn, d, dmin, kind, portable):
            return x.new_empty(x.shape[0], codes.shape[0] * LANES)
    except RuntimeError:            # registered already in this process (a module re-imported)
        pass
    _STATE["fake"] = True


# ------------------------------------------------------------------ GGUF blocks -> codes and scales
def _blocks(raw: np.ndarray, size: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % size:
        raise SpecboundError(f"K-quant data must be [rows, n·{size}] bytes, got {raw.shape}")
    return raw.reshape(raw.shape[0], raw.shape[1] // size, size)


def q4_k_codes(raw: np.ndarray):
    """Q4_K rows [R, n·144 bytes] -> (q [R, C] 0..15, sc [R, C/32], m [R, C/32], d [R, C/256], dmin [R, C/256])."""
    b = _blocks(raw, Q4_K_BYTES)
    rows, n = b.shape[:2]
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]
    dmin = b[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    s = b[..., 4:16]
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    m = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    qs = b[..., 16:].reshape(rows, n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 0x0F).reshape(rows, n * 256)
    return q, sc.reshape(rows, n * 8), m.reshape(rows, n * 8), d, dmin


def q6_k_codes(raw: np.ndarray):
    """Q6_K rows [R, n·210 bytes] -> (q [R, C] 0..63, sc [R, C/16] int8, d [R, C/256])."""
    b = _blocks(raw, Q6_K_BYTES)
    rows, n = b.shape[:2]
    ql, qh = b[..., :128], b[..., 128:192]
    sc = b[..., 192:208].copy().view(np.int8)
    d = b[..., 208:210].copy().view(np.float16).astype(np.float32)[..., 0]
    low = (ql.reshape(rows, n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(rows, n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03
    q = low.reshape(rows, n, 8, 32) | (high.reshape(rows, n, 8, 32) << 4)
    return q.reshape(rows, n * 256), sc.reshape(rows, n * 16), d


def _lanes(a: np.ndarray) -> np.ndarray:
    """[R, G] per-row values -> [R/16, G, 16] (lane r = row 16b + r)."""
    rows, g = a.shape
    return np.ascontiguousarray(a.reshape(rows // LANES, LANES, g).transpose(0, 2, 1))


def _check_rows(rows: int, cols: int) -> None:
    if rows % LANES or cols % 256:
        raise SpecboundError(f"K-quant kernel needs rows % 16 == 0 and columns % 256 == 0, got [{rows}, {cols}]")


def pack_q4_k(raw: np.ndarray) -> dict:
    """The kernel's tensors for a Q4_K weight (``kquant.cpp`` documents the layout)."""
    q, sc, m, d, dmin = q4_k_codes(raw)
    rows, cols = q.shape
    _check_rows(rows, cols)
    q = q.reshape(rows // LANES, LANES, cols // 32, 4, 2, 4)           # (b, r, g, chunk, half, j)
    codes = (q[..., 0, :] | (q[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4).reshape(rows // LANES, cols // 32, 256)
    return {"kind": 4, "codes": np.ascontiguousarray(codes), "sc": _lanes(sc), "mn": _lanes(m),
            "d": _lanes(d), "dmin": _lanes(dmin), "shape": (rows, cols)}


def pack_q6_k(raw: np.ndarray) -> dict:
    q, sc, d = q6_k_codes(raw)
    rows, cols = q.shape
    _check_rows(rows, cols)
    q = q.reshape(rows // LANES, LANES, cols // 16, 4, 4)                # (b, r, g, chunk, j)
    codes = q.transpose(0, 2, 3, 1, 4).reshape(rows // LANES, cols // 16, 256)
    return {"kind": 6, "codes": np.ascontiguousarray(codes.astype(np.uint8)), "sc": _lanes(sc), "mn": None,
            "d": _lanes(d), "dmin": None, "shape": (rows, cols)}


def _unlane(a: np.ndarray) -> np.ndarray:
    blocks, g, _ = a.shape
    return a.transpose(0, 2, 1).reshape(blocks * LANES, g)


def dequantize_packed(packed: dict) -> np.ndarray:
    """The float32 weight [R, C] the packed tensors hold, computed as GGUF's own dequantisation does
    (``d·sc`` then ``·q − dmin·m``, float32): equal to the file's dequantised weight bit for bit (tested)."""
    rows, cols = packed["shape"]
    codes = packed["codes"]
    if packed["kind"] == 4:
        c = codes.reshape(rows // LANES, cols // 32, 4, LANES, 4)        # (b, g, chunk, r, j)
        q = np.stack([c & 0x0F, c >> 4], axis=3)                         # (b, g, chunk, half, r, j)
        q = q.transpose(0, 4, 1, 2, 3, 5).reshape(rows, cols).astype(np.float32)
        d = np.repeat(_unlane(packed["d"]), 8, axis=1) * _unlane(packed["sc"]).astype(np.float32)
        dm = np.repeat(_unlane(packed["dmin"]), 8, axis=1) * _unlane(packed["mn"]).astype(np.float32)
        return (np.repeat(d, 32, axis=1) * q - np.repeat(dm, 32, axis=1)).astype(np.float32)
    c = codes.reshape(rows // LANES, cols // 16, 4, LANES, 4)
    q = c.transpose(0, 3, 1, 2, 4).reshape(rows, cols).astype(np.int16) - 32
    d = np.repeat(_unlane(packed["d"]), 16, axis=1) * _unlane(packed["sc"]).astype(np.float32)
    return (np.repeat(d, 16, axis=1) * q.astype(np.float32)).astype(np.float32)


# ------------------------------------------------------------------ the layer
class KQuantLinear(nn.Module):
    """y = x Wᵀ + b with W held as a GGUF K-quant tensor (Q4_K or Q6_K), read by ``specbound_kq::gemm``.

    ``portable=True`` runs the kernel's portable C++ path (the same bits, slower): for tests, and the
    path taken on CPUs without AVX-512 VNNI."""

    def __init__(self, packed: dict, bias: torch.Tensor | None = None, portable: bool = False):
        super().__init__()
        load_kernel()
        self.kind = int(packed["kind"])
        if self.kind not in KQUANT_KINDS.values():
            raise SpecboundError(f"unknown K-quant kind {self.kind}")
        self.out_features, self.in_features = packed["shape"]
        self.portable = int(bool(portable))
        for name in ("codes", "sc", "mn", "d", "dmin"):
            value = packed.get(name)
            tensor = torch.empty(0, dtype=torch.uint8 if name != "d" and name != "dmin" else torch.float32) \
                if value is None else torch.from_numpy(np.ascontiguousarray(value))
            self.register_buffer(name, tensor, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if shape[-1] != self.in_features:
            raise SpecboundError(f"input width {shape[-1]} != layer's {self.in_features}")
        rows = x.reshape(-1, self.in_features).float().contiguous()
        y = torch.ops.specbound_kq.gemm(rows, self.codes, self.sc, self.mn, self.d, self.dmin, self.kind,
                                        self.portable)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.sc, self.mn, self.d, self.dmin))

    def extra_repr(self) -> str:
        name = {4: "Q4_K", 6: "Q6_K"}[self.kind]
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={name} (GGUF's own), " \
               "activations=int8 per 32 inputs"
