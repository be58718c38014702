"""The GGUF file's own K-quant weights (Q4_K, Q6_K) read by specbound's CPU GEMM (``kquant_core.cpp``).

:class:`KQuantLinear` keeps the file's 4-bit (Q4_K) or 6-bit (Q6_K) codes and group scales exactly
(Q4_K: w = d · sc_g · q − dmin · m_g; Q6_K: w = d · sc_g · (q − 32)) — the int8 target (:mod:`.int8`)
streams 1.5 bytes per weight more — and multiplies them by activations rounded to int8 per row and per
32 inputs, with exact integer sums and a fixed float order: batch-invariant (a row's output does not
depend on the other rows, tested bit for bit), so a verify pass of k tokens agrees with one-token
decoding. One path per CPU family (AVX-512 VNNI, AVX-VNNI, AVX2, NEON dot product, i8mm) and a
portable one, all the same bits, chosen at load from what the CPU and OS support (:func:`kernel_path`;
``SPECBOUND_KQUANT_PATH`` forces one); compiled once per machine (~10 s, ``~/.cache/torch_extensions``;
:func:`kernel_available` says whether it built). Details: docs/quantised-targets.md.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..assets.cache import CacheCorrupt, changed_file_problems, mark_verified, read_manifest, write_manifest
from ..errors import SpecboundError

__all__ = ["KQUANT_ARCHITECTURES", "KQUANT_KINDS", "KQuantEmbedding", "KQuantLinear", "dequantize_packed", "dequantize_rows",
           "fuse_kquant_inputs", "kernel_available", "load_gguf_kquant", "load_kernel", "pack_q4_k", "pack_q4_values",
           "pack_q6_k", "q4_k_codes", "q6_k_codes", "quantize_kquant", "quantize_q4_k", "read_kquant_cache", "check_kquant_copy", "unpermute_rows", "kernel_path", "kernel_paths", "supported_paths", "check_path", "kernel_hash",
           "write_kquant_cache"]

#: GGUF tensor types this kernel reads, by name: the kernel's ``kind``.
KQUANT_KINDS = {"Q4_K": 4, "Q6_K": 6}
Q4_K_BYTES, Q6_K_BYTES = 144, 210     # bytes per 256-weight super-block in a GGUF file
LANES = 16
_LOCK = threading.Lock()
_STATE: dict = {}


#: The kernel's source files (kquant.cpp is the torch binding, kquant_core.cpp the arithmetic).
KERNEL_SOURCES = ("kquant.cpp", "kquant_core.cpp", "kquant_core.h", "kquant_x86.inc", "kquant_x86_256.inc",
                  "kquant_arm.inc", "kquant_arm_kernels.inc")
#: The environment variable that forces a kernel path (refused where the CPU lacks it).
PATH_VARIABLE = "SPECBOUND_KQUANT_PATH"


def kernel_hash() -> str:
    """A hash of the kernel's sources: names its build and keys what was measured with it."""
    import hashlib

    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update(name.encode() + b"\0" + Path(__file__).with_name(name).read_bytes())
    return digest.hexdigest()[:12]


def load_kernel() -> None:
    """Compile (once per machine and kernel version; cached by torch) and load the K-quant kernel; a clear
    error if it cannot. The build carries every path; which runs is decided per CPU at load."""
    with _LOCK:
        if "error" in _STATE:
            raise SpecboundError(_STATE["error"])
        if _STATE.get("loaded"):
            return
        try:
            from torch.utils import cpp_extension

            here = Path(__file__).parent
            cpp_extension.load(name=f"specbound_kquant_{kernel_hash()}",
                               sources=[str(here / "kquant.cpp"), str(here / "kquant_core.cpp")],
                               extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp"], extra_ldflags=["-fopenmp"],
                               extra_include_paths=[str(here)], is_python_module=False, verbose=False)
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers: every cause ends the same way
            _STATE["error"] = (f"the K-quant kernel did not build ({type(exc).__name__}: {str(exc)[:300]}); "
                               "it needs a C++ compiler (g++) and torch's headers")
            raise SpecboundError(_STATE["error"]) from None
        _register_fake()
        names = str(torch.ops.specbound_kq.path_names()).split(",")
        mask = int(torch.ops.specbound_kq.supported_paths())
        _STATE["names"] = names
        _STATE["supported"] = [n for i, n in enumerate(names) if mask >> i & 1]
        _STATE["best"] = names[int(torch.ops.specbound_kq.best_path())]
        _STATE["loaded"] = True


def kernel_available() -> bool:
    try:
        load_kernel()
    except SpecboundError:
        return False
    return True


def kernel_paths() -> list[str]:
    """Every kernel path this build knows, by name (portable, avx2, avxvnni, avx512vnni, neon, neon-i8mm)."""
    load_kernel()
    return list(_STATE["names"])


def supported_paths() -> list[str]:
    """The kernel paths this CPU and OS run (from CPUID/XGETBV or the ARM hardware capabilities)."""
    load_kernel()
    return list(_STATE["supported"])


def check_path(name: str) -> str:
    """``name`` if it is a kernel path this CPU runs; a clear error naming the choices otherwise."""
    load_kernel()
    if name not in _STATE["names"]:
        raise SpecboundError(f"unknown K-quant kernel path {name!r}: choose one of {', '.join(_STATE['names'])}")
    if name not in _STATE["supported"]:
        raise SpecboundError(f"the K-quant kernel path {name!r} does not run on this CPU (it runs: "
                             f"{', '.join(_STATE['supported'])})")
    return name


def kernel_path() -> str:
    """The kernel path in use: ``SPECBOUND_KQUANT_PATH`` where set (checked: refused where the CPU lacks
    it), else the fastest this CPU runs (AVX-512 VNNI > AVX-VNNI > AVX2 > NEON i8mm > NEON > portable)."""
    import os

    load_kernel()
    forced = os.environ.get(PATH_VARIABLE, "").strip()
    if forced:
        try:
            return check_path(forced)
        except SpecboundError as exc:
            raise SpecboundError(f"{PATH_VARIABLE}={forced}: {exc}") from None
    return _STATE["best"]


def path_id(name: str) -> int:
    """The number the operator takes for kernel path ``name``."""
    return _STATE["names"].index(check_path(name))


def _register_fake() -> None:
    if _STATE.get("fake"):
        return
    try:
        @torch.library.register_fake("specbound_kq::gemm")
        def _fake(x, codes, sc, mn, d, dmin, kind, path):
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
    return pack_q4_values(*q4_k_codes(raw))


def pack_q4_values(q: np.ndarray, sc: np.ndarray, m: np.ndarray, d: np.ndarray, dmin: np.ndarray) -> dict:
    """The kernel's tensors from Q4_K values: codes q [R, C] in 0..15, group scales and mins [R, C/32]
    in 0..63, super-block factors d, dmin [R, C/256] (float32)."""
    rows, cols = q.shape
    _check_rows(rows, cols)
    q = np.asarray(q, dtype=np.uint8).reshape(rows // LANES, LANES, cols // 32, 4, 2, 4)   # (b, r, g, chunk, half, j)
    codes = (q[..., 0, :] | (q[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4).reshape(rows // LANES, cols // 32, 256)
    return {"kind": 4, "codes": np.ascontiguousarray(codes), "sc": _lanes(np.asarray(sc, dtype=np.uint8)),
            "mn": _lanes(np.asarray(m, dtype=np.uint8)), "d": _lanes(np.asarray(d, dtype=np.float32)),
            "dmin": _lanes(np.asarray(dmin, dtype=np.float32)), "shape": (rows, cols)}


def quantize_q4_k(weight) -> dict:
    """A float weight [R, C] rounded to Q4_K values (per 32 inputs an affine 4-bit grid, its step and
    offset on 6-bit multiples of per-256 factors), packed for the kernel. For tests and small models:
    the packaged targets are read from their GGUF file, never re-quantised."""
    w = np.asarray(weight.detach().float() if isinstance(weight, torch.Tensor) else weight, dtype=np.float32)
    rows, cols = w.shape
    _check_rows(rows, cols)
    g = w.reshape(rows, cols // 256, 8, 32)
    low = np.minimum(g.min(axis=3), 0.0)                     # w = a q - b with b >= 0
    step = (g.max(axis=3) - low) / 15.0
    d = np.maximum(step.max(axis=2), 1e-12) / 63.0
    dmin = np.maximum((-low).max(axis=2), 1e-12) / 63.0
    sc = np.clip(np.rint(step / d[..., None]), 1, 63)
    m = np.clip(np.rint(-low / dmin[..., None]), 0, 63)
    a = (d[..., None] * sc).astype(np.float32)
    b = (dmin[..., None] * m).astype(np.float32)
    q = np.clip(np.rint((g + b[..., None]) / a[..., None]), 0, 15)
    return pack_q4_values(q.reshape(rows, cols), sc.reshape(rows, -1), m.reshape(rows, -1),
                          d.astype(np.float32), dmin.astype(np.float32))


def pack_q6_k(raw: np.ndarray) -> dict:
    q, sc, d = q6_k_codes(raw)
    rows, cols = q.shape
    _check_rows(rows, cols)
    q = np.asarray(q, dtype=np.uint8).reshape(rows // LANES, LANES, cols // 16, 4, 4)   # (b, r, g, chunk, j)
    q = q.transpose(0, 2, 3, 1, 4).reshape(rows // LANES, cols // 16, 4, 64)            # (b, g, chunk, 4r + j)
    low, high = q & 0x0F, q >> 4
    codes = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4),
                            high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)],
                           axis=-1)                                             # 6 bits per code: 192 bytes
    return {"kind": 6, "codes": np.ascontiguousarray(codes, dtype=np.uint8), "sc": _lanes(sc), "mn": None,
            "d": _lanes(d), "dmin": None, "shape": (rows, cols)}


def dequantize_rows(kind: int, cols: int, codes, sc, mn, d, dmin, rows: torch.Tensor) -> torch.Tensor:
    """The float32 weight rows ``rows`` [n] -> [n, cols] of packed K-quant tensors, computed as GGUF's
    own dequantisation does (``d·sc`` then ``·q − dmin·m``, float32), so they equal the file's
    dequantised rows bit for bit (tested). Serves :func:`dequantize_packed` and :class:`KQuantEmbedding`."""
    block, lane, n = rows // LANES, rows % LANES, rows.numel()
    pick = torch.arange(n)
    if kind == 4:
        c = codes[block].view(n, cols // 32, 4, LANES, 4)[pick, :, :, lane]                 # [n, g, chunk, j]
        q = torch.stack([c & 0x0F, c >> 4], dim=3).reshape(n, cols).float()               # (g, chunk, half, j)
        scale = d[block, :, lane].repeat_interleave(8, 1) * sc[block, :, lane].float()
        low = dmin[block, :, lane].repeat_interleave(8, 1) * mn[block, :, lane].float()
        return scale.repeat_interleave(32, 1) * q - low.repeat_interleave(32, 1)
    c = codes[block].view(n, cols // 16, 3, LANES, 4)[pick, :, :, lane].to(torch.int16)   # [n, g, part, j]
    low = torch.stack([c[:, :, 0] & 15, c[:, :, 1] & 15, c[:, :, 0] >> 4, c[:, :, 1] >> 4], dim=2)
    high = torch.stack([(c[:, :, 2] >> (2 * k)) & 3 for k in range(4)], dim=2)               # [n, g, chunk, j]
    q = ((low | (high << 4)).reshape(n, cols) - 32).float()
    scale = d[block, :, lane].repeat_interleave(16, 1) * sc[block, :, lane].view(torch.int8).float()
    return scale.repeat_interleave(16, 1) * q


def dequantize_packed(packed: dict) -> np.ndarray:
    """The float32 weight [R, C] the packed tensors hold (:func:`dequantize_rows` of every row)."""
    rows, cols = packed["shape"]
    tensors = [None if packed.get(n) is None else torch.from_numpy(np.ascontiguousarray(packed[n]))
               for n in ("codes", "sc", "mn", "d", "dmin")]
    return dequantize_rows(int(packed["kind"]), cols, *tensors, torch.arange(rows)).numpy()


# ------------------------------------------------------------------ the layer
class KQuantLinear(nn.Module):
    """y = x Wᵀ + b with W held as a GGUF K-quant tensor (Q4_K or Q6_K), read by ``specbound_kq::gemm``.

    ``kernel`` names the kernel path (:func:`kernel_path`'s by default; every path gives the same bits);
    ``portable=True`` is ``kernel="portable"``, the plain C++ definition."""

    def __init__(self, packed: dict, bias: torch.Tensor | None = None, portable: bool = False, *,
                 kernel: str | None = None):
        super().__init__()
        load_kernel()
        self.kind = int(packed["kind"])
        if self.kind not in KQUANT_KINDS.values():
            raise SpecboundError(f"unknown K-quant kind {self.kind}")
        self.out_features, self.in_features = packed["shape"]
        self.kernel = "portable" if portable else (kernel or kernel_path())
        self.kernel_number = path_id(self.kernel)
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
                                        self.kernel_number)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.sc, self.mn, self.d, self.dmin))

    def extra_repr(self) -> str:
        name = {4: "Q4_K", 6: "Q6_K"}[self.kind]
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={name} (GGUF's own), " \
               "activations=int8 per 32 inputs"


class KQuantEmbedding(nn.Module):
    """Token embedding read from the same packed K-quant tensor as a tied output layer: the rows a read
    asks for are dequantised as GGUF does (``d·sc`` then ``·q − dmin·m``), so they equal the file's."""

    def __init__(self, layer: KQuantLinear):
        super().__init__()
        self.layer = layer
        self.num_embeddings, self.embedding_dim = layer.out_features, layer.in_features

    @property
    def weight(self) -> torch.Tensor:            # what code reading ``embed_tokens.weight`` (dtype, device) sees
        return self.layer.d[:1, 0, :1]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        w = dequantize_rows(layer.kind, layer.in_features, layer.codes, layer.sc, layer.mn, layer.d, layer.dmin,
                            ids.reshape(-1).long())
        return w.reshape(*ids.shape, layer.in_features)


#: GGUF tensor names of a Llama-form decoder (qwen2, llama) -> Hugging Face module paths.
_GGUF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
#: GGUF architectures the K-quant target reads. llama's converter permutes the q/k rows of every head for
#: llama.cpp's rotary layout (pairs of adjacent rows); they are put back in Hugging Face's order on reading
#: (:func:`unpermute_rows`). Mistral and SmolLM2 files are "llama" too.
KQUANT_ARCHITECTURES = ("qwen2", "llama")
_PERMUTED = {"llama": ("attn_q", "attn_k")}


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection as llama.cpp's converter wrote them (per head, row 2i + j holds
    Hugging Face's row j·d/2 + i, d the head size) back in Hugging Face's order. Works on any row
    payload (float rows or a row's quantised blocks): only whole rows move."""
    n = rows.shape[0]
    if heads < 1 or n % (2 * heads):
        raise SpecboundError(f"cannot un-permute {n} rows for {heads} heads")
    return np.ascontiguousarray(rows.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape))


def _field(reader, name: str):
    field = reader.fields.get(name)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types and field.types[0].name == "STRING" else int(value[0])


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "token_embd":
        return "model.embed_tokens." + parts[-1]
    if parts[0] == "output_norm":
        return "model.norm." + parts[-1]
    if parts[0] == "output":
        return "lm_head." + parts[-1]
    if parts[0] == "blk" and parts[2] in _GGUF_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[-1]}"
    raise SpecboundError(f"unexpected GGUF tensor {gguf_name!r}")


def _open_gguf(path: Path):
    """``(reader, config, tokenizer)`` of a qwen2 GGUF file: its tensors not yet read, its config and
    tokenizer parsed from the file's metadata by transformers."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    reader = gguf.GGUFReader(str(path))
    arch = _field(reader, "general.architecture") or "?"
    if arch not in KQUANT_ARCHITECTURES:
        raise SpecboundError(f"{path.name}: architecture {arch!r}; the K-quant target reads {KQUANT_ARCHITECTURES}")
    with parsed_once(path, reader):
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    return reader, config, tokenizer


def _gguf_tensors(reader, path: Path):
    """The file's tensors one at a time, by Hugging Face name: a packed K-quant layer (dict, the name
    without ".weight") or a float tensor (norms, biases). Each tensor's mapped pages are released once it
    is unpacked, so streaming them into the on-disk copy never holds the file and its copy at once."""
    arch = _field(reader, "general.architecture")
    heads = {"attn_q": _field(reader, f"{arch}.attention.head_count"),
             "attn_k": _field(reader, f"{arch}.attention.head_count_kv") or _field(reader, f"{arch}.attention.head_count")}
    for t in reader.tensors:
        kind = t.tensor_type.name
        parts = t.name.split(".")
        permuted = len(parts) > 2 and parts[2] in _PERMUTED.get(arch, ())
        if kind == "F32":
            shape = tuple(reversed([int(n) for n in t.shape]))
            value = np.array(t.data, dtype=np.float32).reshape(shape)
            if permuted:
                value = unpermute_rows(value, heads[parts[2]])
            yield _hf_name(t.name), torch.from_numpy(value.copy())
        elif kind in KQUANT_KINDS:
            raw = unpermute_rows(np.asarray(t.data), heads[parts[2]]) if permuted else t.data
            yield _hf_name(t.name)[: -len(".weight")], pack_q4_k(raw) if kind == "Q4_K" else pack_q6_k(raw)
        else:
            width = int(t.shape[0])
            why = (f" (its rows are {width} wide: K-quants need multiples of 256, so the file could not store it as one)"
                   if width % 256 else "")
            raise SpecboundError(f"{path.name}: tensor {t.name} is {kind}{why}; the K-quant target reads Q4_K and Q6_K "
                                 "only (the default decodes such a file plainly on llama.cpp)")
        _release_pages(reader, int(t.data_offset), int(t.n_bytes))


def _release_pages(reader, offset: int, length: int) -> None:
    """Drop the resident pages of ``length`` bytes at ``offset`` of the reader's read-only map of the
    file (they are read again from the file if touched; nothing is lost). Best effort."""
    import mmap

    buffer = getattr(reader.data, "_mmap", None)
    if buffer is None or not hasattr(buffer, "madvise") or length <= 0:
        return
    start = offset - offset % mmap.PAGESIZE
    try:
        buffer.madvise(mmap.MADV_DONTNEED, start, min(offset + length, len(buffer)) - start)
    except (OSError, ValueError):
        pass


def _convert_gguf(path: Path, directory: Path) -> None:
    """Unpack a GGUF file into its K-quant copy in ``directory``, tensor by tensor; the parse (its
    151k-token vocabulary: ~0.6 GB of Python objects for the packaged target) is dropped before the
    model is built from the copy."""
    import gc

    reader, config, tokenizer = _open_gguf(path)
    write_kquant_cache(directory, path, {"config": config, "tokenizer": tokenizer,
                                         "tensors": _gguf_tensors(reader, path)})
    del reader, config, tokenizer
    gc.collect()


def _read_gguf(path: Path) -> dict:
    """The parts of a qwen2 GGUF file a K-quant target is built from, in memory: packed K-quant layers by
    Hugging Face module name, float tensors (norms, biases), config and tokenizer."""
    reader, config, tokenizer = _open_gguf(path)
    layers, floats = {}, {}
    for name, value in _gguf_tensors(reader, path):
        (layers if isinstance(value, dict) else floats)[name] = value
    return {"layers": layers, "floats": floats, "config": config, "tokenizer": tokenizer}


@contextmanager
def parsed_once(path, reader):
    """While inside, ``gguf.GGUFReader(path)`` returns ``reader`` (already open on that file) instead of
    parsing the file again. transformers builds a GGUF file's config and its tokenizer from two more
    parses of its metadata (``load_gguf_checkpoint``), ~7 s apiece here for the packaged target's
    151k-token vocabulary: a third of its first load (docs/results/RESULTS.md, 2026-12-07).
    They only read the reader's fields. Any other file, or a reader asked for with other arguments, is
    parsed as usual; a transformers that imported the class elsewhere just parses again (slower, the same)."""
    import gguf

    original = gguf.GGUFReader
    resolved = Path(path).resolve()

    def reader_for(file, *args, **kwargs):
        if not args and not kwargs and Path(file).resolve() == resolved:
            return reader
        return original(file, *args, **kwargs)

    gguf.GGUFReader = reader_for
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _build(parts: dict, kernel: str):
    """The Hugging Face module tree of ``parts`` (see :func:`_read_gguf`) with K-quant layers."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(parts["config"], dtype=torch.float32)
    floats = dict(parts["floats"])
    layers = parts["layers"]
    embedding_name = "model.embed_tokens"
    for name, packed in layers.items():
        if name == embedding_name:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, KQuantLinear(packed, floats.pop(name + ".bias", None), kernel=kernel))
    if embedding_name not in layers:
        raise SpecboundError("the GGUF file has no K-quant token embedding (token_embd)")
    embed = KQuantLinear(layers[embedding_name], None, kernel=kernel)
    model.model.embed_tokens = KQuantEmbedding(embed)
    if "lm_head" not in layers:
        model.lm_head = embed                     # tied: the output layer reads the embedding's blocks
    model.load_state_dict(floats, strict=False, assign=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise SpecboundError(f"no tensor for {len(missing)} parameters (e.g. {missing[0]})")
    model.config.tie_word_embeddings = False
    return model.eval()


def load_gguf_kquant(path, portable: bool = False, cache_dir=None, *, kernel: str | None = None):
    """``(model, tokenizer)``: the Hugging Face module tree of a qwen2 GGUF file whose linear layers are
    :class:`KQuantLinear` over the file's own Q4_K / Q6_K blocks (nothing re-quantised; no float copy
    of the weights is made), its norms and biases float32 from the file, the embedding read from the
    token-embedding blocks. A tensor of another type (Q8_0, F16 …) is refused with its name.

    With ``cache_dir``, the unpacked tensors, config and tokenizer are kept there (written once,
    ~1.3 GB): a later load reads them back in seconds instead of parsing the GGUF file (~30 s). The
    copy records the source file's size and modification time and its own file sizes; a copy that
    does not match is rebuilt (:func:`read_kquant_cache`)."""
    load_kernel()
    path = Path(path)
    if cache_dir is None:
        parts = _read_gguf(path)
    else:
        parts = read_kquant_cache(Path(cache_dir), path)
        if parts is None:             # unpacked tensor by tensor straight into the copy, then read as a warm run
            _convert_gguf(path, Path(cache_dir))
            parts = read_kquant_cache(Path(cache_dir), path)
            if parts is None:
                raise SpecboundError(f"the K-quant copy just written to {cache_dir} does not read back")
    return _build(parts, "portable" if portable else (kernel or kernel_path())), parts["tokenizer"]


# ------------------------------------------------------------------ the on-disk copy
KQUANT_FORMAT = "specbound-kquant-v3"          # v3: a sha256 manifest; v2: Q6_K codes packed in 6 bits (v1: bytes)
_PACKED_FIELDS = ("codes", "sc", "mn", "d", "dmin")


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_kquant_cache(directory: Path, source: Path, parts: dict) -> None:
    """Write ``parts`` into ``directory`` (replaced whole: written next to it, then renamed). The tensors
    are ``parts["layers"]`` and ``parts["floats"]`` (dicts), or ``parts["tensors"]``: (name, packed layer
    dict or float tensor) pairs, streamed — each is written and dropped before the next is made, so a
    first load never holds the whole unpacked model in memory beside the file it came from."""
    import itertools
    import shutil

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = parts.get("tensors")
    if tensors is None:
        tensors = itertools.chain(parts["layers"].items(), parts["floats"].items())
    header, layers, floats, offset = {}, {}, [], 0
    with open(tmp / "kquant.data", "wb") as data:
        def put(key: str, array) -> None:
            nonlocal offset
            array = np.ascontiguousarray(array.numpy() if isinstance(array, torch.Tensor) else array)
            dtype = _SAFETENSORS_NAMES.get(array.dtype)
            if dtype is None:
                raise SpecboundError(f"{key}: dtype {array.dtype} cannot be kept in the K-quant copy")
            data.write(array.tobytes())
            header[key] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
            offset += array.nbytes

        for name, value in tensors:
            if isinstance(value, dict):
                layers[name] = {"kind": int(value["kind"]), "shape": list(value["shape"])}
                for field in _PACKED_FIELDS:
                    if value.get(field) is not None:
                        put(f"{name}.{field}", value[field])
            else:
                floats.append(name)
                put(name, value.detach().float() if value.dtype != torch.float32 else value.detach())
    _join_safetensors(tmp / "kquant.data", tmp / "kquant.safetensors",
                      dict(header, __metadata__={"format": KQUANT_FORMAT}))
    parts["config"].save_pretrained(str(tmp))
    parts["tokenizer"].save_pretrained(str(tmp))
    (tmp / "kquant.json").write_text(json.dumps({"format": KQUANT_FORMAT, "source": _source_stamp(source),
                                                 "layers": layers, "floats": sorted(floats)}, indent=1),
                                     encoding="utf-8")
    manifest = write_manifest(tmp, info={"format": KQUANT_FORMAT, "source": str(Path(source).resolve())})
    mark_verified(tmp, manifest["files"])
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)


def _join_safetensors(data_path: Path, path: Path, header: dict) -> None:
    """A safetensors file (8-byte little-endian header size, the JSON header padded with spaces to a
    multiple of 8, the tensors' bytes) from a header and the bytes written at its offsets; the data
    file is removed."""
    import shutil

    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out, open(data_path, "rb") as data:
        out.write(len(text).to_bytes(8, "little"))
        out.write(text)
        shutil.copyfileobj(data, out, 16 << 20)
    data_path.unlink()


def read_kquant_cache(directory: Path, source: Path) -> dict | None:
    """The parts kept in ``directory`` for ``source``, or None (with a note on stderr saying why) when
    there is no usable copy: missing, another format, made from another file, or a file of the wrong
    size (a partial write). The caller then rebuilds it."""
    import sys

    directory = Path(directory)
    if not (directory / "kquant.json").is_file():
        return None
    try:
        desc = json.loads((directory / "kquant.json").read_text(encoding="utf-8"))
        problem = None
        if desc.get("format") != KQUANT_FORMAT:
            problem = f"format {desc.get('format')!r}"
        elif desc.get("source") != _source_stamp(Path(source)):
            problem = "made from another GGUF file (size or modification time differ)"
        else:
            manifest = read_manifest(directory)
            problems = ["no manifest"] if manifest is None else changed_file_problems(directory, manifest)
            problem = "; ".join(problems) or None
        if problem is None:
            return _read_parts(directory, desc)
    except (OSError, ValueError, KeyError, TypeError, SpecboundError, CacheCorrupt) as exc:
        problem = f"unreadable ({type(exc).__name__}: {exc})"
    print(f"{directory}: the K-quant copy is not usable ({problem}); rebuilding it from {Path(source).name}",
          file=sys.stderr)
    return None


def check_kquant_copy(directory: Path, *, full: bool = False) -> tuple[str, list[str]]:
    """State of a K-quant copy as ``assets list`` shows it: ("missing" | "outdated" | "ok" | "verified" |
    "damaged", problems). The cheap check reads sizes and hashes what changed since it last matched; ``full``
    recomputes every sha256."""
    from ..assets.cache import manifest_problems

    directory = Path(directory)
    if not (directory / "kquant.json").is_file():
        return "missing", []
    try:
        fmt = json.loads((directory / "kquant.json").read_text(encoding="utf-8")).get("format")
        manifest = read_manifest(directory)
    except (OSError, ValueError, AttributeError, CacheCorrupt) as exc:
        return "damaged", [str(exc)]
    if fmt != KQUANT_FORMAT or manifest is None:
        return "outdated", [f"format {fmt!r}, made by another specbound version: the next load rebuilds it"]
    problems = manifest_problems(directory, manifest, full=True) if full else changed_file_problems(directory, manifest)
    if full and not problems:
        mark_verified(directory, manifest["files"])
    return ("damaged" if problems else "verified" if full else "ok"), problems


_SAFETENSORS_DTYPES = {"U8": np.uint8, "I8": np.int8, "F32": np.float32}
_SAFETENSORS_NAMES = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}


def _mapped_arrays(path: Path) -> dict:
    """The tensors of a safetensors file as copy-on-write memory maps of the file (nothing is copied: the
    weights stay page-cache pages, so a process holds them once, not a mapped and a read copy)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    base = 8 + size
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise SpecboundError(f"{path.name}: tensor {name} has dtype {entry['dtype']}")
        start, stop = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if stop - start != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
            raise SpecboundError(f"{path.name}: tensor {name} has {stop - start} bytes for shape {shape}")
        arrays[name] = np.memmap(path, dtype=dtype, mode="c", offset=base + start, shape=shape) if stop > start \
            else np.zeros(shape, dtype=dtype)
    return arrays


def _read_parts(directory: Path, desc: dict) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    layers, floats = {}, {}
    arrays = _mapped_arrays(directory / "kquant.safetensors")
    for name, layer in desc["layers"].items():
        packed = {"kind": int(layer["kind"]), "shape": tuple(layer["shape"])}
        for field in _PACKED_FIELDS:
            packed[field] = arrays.get(f"{name}.{field}")
        if packed["codes"] is None or packed["sc"] is None or packed["d"] is None:
            raise SpecboundError(f"{name} lacks its codes or scales")
        layers[name] = packed
    for name in desc["floats"]:
        floats[name] = torch.from_numpy(arrays[name])
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return {"layers": layers, "floats": floats, "config": config, "tokenizer": tokenizer}


def fuse_kquant_inputs(model, groups=(("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))) -> int:
    """Compute K-quant layers that read one input with one kernel call each (their 16-row blocks
    stacked; layers of different kinds are left apart). Exact: each output row's computation is
    unchanged. Returns the number of groups fused."""
    from .int8 import share_input

    count = 0
    for module in list(model.modules()):
        for names in groups:
            layers = [getattr(module, n, None) for n in names]
            if not all(isinstance(m, KQuantLinear) for m in layers) or len({m.kind for m in layers}) != 1 \
                    or len({m.in_features for m in layers}) != 1:
                continue
            first = layers[0]
            packed = {"kind": first.kind, "shape": (sum(m.out_features for m in layers), first.in_features)}
            for name in ("codes", "sc", "mn", "d", "dmin"):
                parts = [getattr(m, name) for m in layers]
                packed[name] = None if parts[0].numel() == 0 else torch.cat(parts).numpy()
            bias = None
            if any(m.bias is not None for m in layers):
                bias = torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in layers])
            share_input(module, names, layers, KQuantLinear(packed, bias, kernel=first.kernel))
            count += 1
    return count


def quantize_kquant(model) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` rounded to Q4_K (:func:`quantize_q4_k`) and read by the K-quant
    kernel, a tied or untied input embedding read from its own Q4_K blocks (in place; returns the
    model). For tests and small models whose widths are multiples of 256 (inputs) and 16 (outputs)."""
    for qualified, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, KQuantLinear(quantize_q4_k(child.weight), child.bias))
    embedding = model.get_input_embeddings()
    if isinstance(embedding, nn.Embedding):
        model.set_input_embeddings(KQuantEmbedding(KQuantLinear(quantize_q4_k(embedding.weight))))
    return model
