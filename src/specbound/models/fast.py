"""Faster CPU forwards for unmodified Hugging Face models.

Two transforms, both applied in place to a loaded model:

* :func:`prepack_linears` (exact, for the target): every ``nn.Linear`` becomes a
  :class:`PrepackedLinear` whose weight is converted once to oneDNN's blocked layout. The GEMM
  then streams the weights once for any number of new tokens k, instead of repacking the whole
  matrix on every call as the default k ≥ 2 path does; results equal ``F.linear`` up to float32
  rounding (tested).
* :func:`quantize_int8` (lossy, for the draft only): weight-only int8 dynamic quantisation.
  The draft's law changes, which costs acceptance but never correctness: verification always
  uses the distribution the draft actually sampled from.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

__all__ = ["PrepackedLinear", "prepack_linears", "quantize_int8", "prepack_available"]


def prepack_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())


class PrepackedLinear(nn.Module):
    """y = x Wᵀ + b with W stored once in oneDNN's prepacked layout (inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        self.register_buffer("packed_weight", weight.to_mkldnn(), persistent=False)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.register_buffer("packed_bias", bias.to_mkldnn(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features).float().contiguous()
        y = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), self.packed_weight, self.packed_bias).to_dense()
        return y.reshape(*lead, self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked=oneDNN"


def _swap_linears(module: nn.Module, make) -> int:
    count = 0
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            setattr(module, name, make(child))
            count += 1
        else:
            count += _swap_linears(child, make)
    return count


def prepack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a float32 model by a :class:`PrepackedLinear`; returns the count.

    Falls back (with a warning, returning 0) where oneDNN is unavailable or the model is not fp32.
    """
    if not prepack_available():
        warnings.warn("oneDNN is not available in this torch build: using the eager linear layers", stacklevel=2)
        return 0
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        warnings.warn(f"prepacked linears need a float32 model (got {dtype}): using eager layers", stacklevel=2)
        return 0
    with torch.no_grad():
        return _swap_linears(model, PrepackedLinear)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Weight-only int8 dynamic quantisation of the linear layers (draft models only: lossy)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
