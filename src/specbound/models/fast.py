"""Faster fp32 CPU forwards for unmodified Hugging Face models, and memory hygiene while converting.

:func:`prepack_linears` (exact): every ``nn.Linear`` becomes a :class:`PrepackedLinear` whose
weight is reordered once into oneDNN's blocked layout for small batches. The GEMM then streams the
weights once for any number of new tokens k ≤ 16 at about the cost of one, instead of repacking
the whole matrix on every call as the default k ≥ 2 path does; results equal ``F.linear`` up to
float32 rounding (tested). int8 models (targets and drafts) are in :mod:`specbound.models.int8`.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ["PrepackedLinear", "prepack_available", "prepack_linears", "trim_heap"]


def prepack_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())


REORDER_ROWS = 16


class PrepackedLinear(nn.Module):
    """y = x Wᵀ + b with W reordered once into oneDNN's blocked layout for small batches (inference only).

    Why (measured, 1536→8960 fp32, 2 threads; ``benchmarks/verify_pass.py``, whole-model t(k) in
    docs/results/verify-cost/verify-cost.md): ``F.linear`` with k ≥ 2
    rows repacks the whole weight matrix on every call (k = 8 costs ~2.4× k = 1), and a oneDNN
    weight converted with ``to_mkldnn`` plus per-call activation conversions still costs ~1.6×.
    Reordering the weight for an ``reorder_rows``-row GEMM and calling oneDNN's pointwise linear on
    plain tensors streams the weights once: k = 1…8 cost about the same (the verify pass of
    speculative decoding becomes ~one decode step). Results equal ``F.linear`` up to float32
    summation order (tested).
    """

    def __init__(self, linear: nn.Linear, reorder_rows: int = REORDER_ROWS):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float().contiguous()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, int(reorder_rows)),
                             persistent=False)
        bias = linear.bias.detach().float().contiguous() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            x = x.float()
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked=oneDNN"


_MADV_DONTNEED = 4


def _release_pages(tensor: torch.Tensor) -> None:
    """Give the pages under a CPU tensor that nothing will read again back to the OS now.

    Loaded weights are views of the memory-mapped checkpoint; once a layer has been converted its
    original pages would otherwise stay resident until the whole mapping goes (the converted
    copies plus the originals peaked at ~2× the weights). Only called for tensors no other
    parameter shares (a tied embedding is never released)."""
    import ctypes
    import mmap

    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
        return
    page = mmap.PAGESIZE
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first, last = -(-start // page) * page, (end // page) * page
    if last > first:
        try:
            ctypes.CDLL(None).madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)
        except (OSError, AttributeError):
            pass


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc ``malloc_trim``): converting layers frees
    many medium-sized temporaries that glibc otherwise keeps, ~0.6x the weights of RSS."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _swap(model: nn.Module, match, make) -> int:
    """Replace every sub-module for which ``match`` holds by ``make(module)``, releasing the pages of
    the replaced weights that no other parameter shares."""
    shared: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):    # a tied weight counts twice
        shared[p.data_ptr()] = shared.get(p.data_ptr(), 0) + 1
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not match(child):
                continue
            setattr(parent, name, make(child))
            count += 1
            for p in child.parameters(recurse=False):
                if shared.get(p.data_ptr(), 0) == 1:
                    _release_pages(p.data)
    trim_heap()
    return count


def prepack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a float32 model by a :class:`PrepackedLinear`; returns the count.

    Falls back (with a warning, returning 0) where oneDNN is unavailable or the model is not fp32.
    """
    if not prepack_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        warnings.warn("oneDNN's prepacked linear is not available in this torch build: using the eager linear "
                      "layers", stacklevel=2)
        return 0
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        warnings.warn(f"prepacked linears need a float32 model (got {dtype}): using eager layers", stacklevel=2)
        return 0
    with torch.no_grad():
        return _swap(model, lambda m: type(m) is nn.Linear, PrepackedLinear)
