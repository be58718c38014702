"""int8 weights for CPU targets and drafts: per-channel weight scales, per-token activation scales.

A target quantised to int8 is a *different target* (as llama.cpp's Q4_K_M is): speculative decoding
stays lossless with respect to it, never with respect to the fp32 model it came from, so the quantised
model must be a well-defined function of its input, and as close to fp32 as the kernel allows.
:class:`Int8Linear` gives both on x86 CPUs with fbgemm: per-channel weight scales, and per-token
activation scales made exact by a constant *anchor row* (−1, +1) appended before fbgemm's dynamic
quantisation, so its one scale per call is the same for every call and the layer is **batch-invariant**
(tested bit for bit: the verify pass of k drafted tokens agrees with one-token decoding); optional
SmoothQuant smoothing. Activations use 8 bits where this CPU's kernels multiply u8×s8 without saturating
(VNNI), 7 where they would (AVX2): :func:`activation_bits`. :class:`Int8Embedding` keeps the embedding as
int8 rows; :func:`save_int8` / :func:`load_int8` write and read such a model as one safetensors file with
its config and tokenizer. Why each piece, in full: docs/notes.md (`models/int8.py`).
"""
from __future__ import annotations

import itertools
import json
import sys
import types
import warnings
import weakref
from pathlib import Path

import torch
from torch import nn

from ..errors import SpecboundError
from .fast import _release_pages, trim_heap

__all__ = [
    "INT8_FORMAT", "Int8Embedding", "Int8Linear", "activation_absmax", "activation_bits", "int8_available", "load_int8",
    "fuse_shared_inputs", "make_batch_invariant", "outlier_channels", "quantize_int8", "read_int8_description", "save_int8", "smoothing_factors",
]

#: Version tag of the on-disk int8 format (read back by :func:`load_int8`).
INT8_FORMAT = "specbound-int8-v1"
WEIGHT_SCALES = ("channel", "tensor")
#: Most outlier channels whose int8 products sum exactly in float32 (n · 127 · 127 < 2**24).
MAX_OUTLIERS = (2 ** 24) // (127 * 127)
ACTIVATION_SCALES = ("token", "tensor")
ACTIVATION_BITS = (7, 8)
_PROBED_BITS: list[int] = []


def int8_available() -> bool:
    """Whether this torch build has fbgemm's quantized linear kernels (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def _prepack(qweight: torch.Tensor, scale: torch.Tensor):
    """fbgemm's packed weight for int8 values [out, in] with 1 (per-tensor) or ``out`` (per-channel)
    float32 scales, zero points 0."""
    with warnings.catch_warnings():        # torch deprecates quantized tensors in favour of torchao; the
        warnings.simplefilter("ignore")    # fbgemm kernels they feed are what this CPU path needs
        if scale.numel() == 1:
            quantized = torch._make_per_tensor_quantized_tensor(qweight.contiguous(), float(scale), 0)
        else:
            zeros = torch.zeros(qweight.shape[0], dtype=torch.long)
            quantized = torch._make_per_channel_quantized_tensor(qweight.contiguous(), scale.double(), zeros, 0)
        return torch.ops.quantized.linear_prepack(quantized, None)


# ----------------------------------------------------------------- fbgemm's GEMM as an operator torch.compile can trace
# fbgemm's packed weight is an opaque script object that torch.compile cannot put in a graph, so a
# compiled read (models/static.py, compiled_layer_step) calls the GEMM through this operator: the layer is named by
# an integer id (a 0-d tensor, so one graph serves every layer), its per-channel scales give the output
# width. Everything around the GEMM (per-token scales, outliers, bias) is traced and fused.
def _gemm_registry() -> types.ModuleType:
    """The process-wide registry behind ``specbound::int8_gemm``: layers by id (weak references) and the
    operator's library. Kept outside this module's namespace, in ``sys.modules``, because an operator is
    registered once per process while this module may be imported again (a test drops and re-imports
    specbound's modules)."""
    registry = sys.modules.get("_specbound_int8_gemm")
    if registry is None:
        registry = types.ModuleType("_specbound_int8_gemm")
        registry.layers, registry.ids, registry.library = {}, itertools.count(1), None
        sys.modules["_specbound_int8_gemm"] = registry
    return registry


def _define_gemm_op() -> None:
    registry = _gemm_registry()
    if registry.library is not None:
        return
    library = torch.library.Library("specbound", "DEF")
    library.define("int8_gemm(Tensor rows, Tensor layer, Tensor scale, bool reduce_range) -> Tensor")

    def gemm(rows, layer, scale, reduce_range):
        owner = registry.layers[int(layer)]()
        return torch.ops.quantized.linear_dynamic(rows, owner._packed, reduce_range)

    def fake(rows, layer, scale, reduce_range):
        return rows.new_empty(rows.shape[0], scale.shape[0])

    library.impl("int8_gemm", gemm, "CPU")
    torch.library.register_fake("specbound::int8_gemm", fake, lib=library)
    registry.library = library


_define_gemm_op()


def activation_bits() -> int:
    """8 if fbgemm's dynamic linear on this CPU computes a worst-case 8-bit product exactly (every
    activation at the top of the u8 range times weights of +127: pair sums of 2·255·127 overflow
    int16 on kernels that sum pairs in 16 bits), else 7. Probed once per process."""
    if not _PROBED_BITS:
        n = 64
        packed = _prepack(torch.full((8, n), 127, dtype=torch.int8), torch.ones(8))
        rows = torch.stack([torch.ones(n), -torch.ones(n)])
        got = torch.ops.quantized.linear_dynamic(rows, packed, False)[:, 0]
        # exact: ±127·n up to one activation step (1/127.5 of the range); saturated pair sums: ~half
        exact = bool(torch.allclose(got, torch.tensor([127.0 * n, -127.0 * n]), rtol=0.01))
        _PROBED_BITS.append(8 if exact else 7)
    return _PROBED_BITS[0]


def _check_bits(bits) -> int:
    bits = activation_bits() if bits is None else bits
    if bits not in ACTIVATION_BITS or isinstance(bits, bool):
        raise SpecboundError(f"activation bits must be one of {ACTIVATION_BITS} or None (this CPU's best), got {bits!r}")
    if bits == 8 and activation_bits() != 8:
        raise SpecboundError("8-bit activations would saturate in this CPU's int8 kernels (no VNNI); use 7")
    return bits


def _quantize_rows(weight: torch.Tensor, per_channel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of a [out, in] float matrix: (int8 values, float32 scales [out] or [1])."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1) if per_channel else w.abs().amax().reshape(1)
    scale = (amax / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None] if per_channel else w / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale.float()


def _row_scales(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """``scale`` as a float32 vector of 1 (per-tensor) or ``rows`` (per-channel) values, or a clear error."""
    scale = scale.detach().float().reshape(-1).clone()
    if scale.numel() not in (1, rows):
        raise SpecboundError(f"{name} has {scale.numel()} values for {rows} output rows")
    return scale


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with int8 weights and int8 activations (fbgemm), see the module docstring.

    Build with :meth:`from_linear` (quantises a float layer) or from stored values. ``activations=
    "token"`` (default) is batch-invariant; ``"tensor"`` is fbgemm's default dynamic quantisation
    (one scale per call), kept for comparison. ``outliers`` (input channel indices, token mode only)
    are read in a group of their own — their own per-token scale (8-bit symmetric) and an exact
    integer product (:meth:`_exact_outliers`) — so a few channels with very large activations do not
    coarsen every other channel's steps (the weight columns of the group are quantised apart too);
    ``qweight``/``scale`` then hold the other columns. ``bits``: activation precision of the fbgemm
    group, 7 or 8 (default: :func:`activation_bits`, the most this CPU computes without saturating).
    """

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                 smooth: torch.Tensor | None = None, activations: str = "token",
                 outliers: torch.Tensor | None = None, qweight_outliers: torch.Tensor | None = None,
                 scale_outliers: torch.Tensor | None = None, bits: int | None = None):
        super().__init__()
        self.bits = _check_bits(bits)
        self.reduce_range = self.bits == 7
        if activations not in ACTIVATION_SCALES:
            raise SpecboundError(f"activations must be one of {ACTIVATION_SCALES}, got {activations!r}")
        if qweight.dtype != torch.int8 or qweight.ndim != 2:
            raise SpecboundError(f"qweight must be an int8 matrix, got {qweight.dtype} {tuple(qweight.shape)}")
        n_out = 0 if outliers is None else int(outliers.numel())
        if n_out and (activations != "token" or qweight_outliers is None or scale_outliers is None
                      or tuple(qweight_outliers.shape) != (qweight.shape[0], n_out)):
            raise SpecboundError("outlier channels need per-token activations and their own int8 columns")
        self.out_features, self.in_features = qweight.shape[0], qweight.shape[1] + n_out
        self.activations = activations
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone(), persistent=False)
        self.register_buffer("inv_smooth", None if smooth is None else (1.0 / smooth.detach().float()).clone(),
                             persistent=False)
        self.scale, self._packed, self.anchor = self._group(qweight, scale)
        registry = _gemm_registry()
        key = next(registry.ids)
        self.gemm_id = torch.tensor(key)                 # this layer's name for specbound::int8_gemm
        registry.layers[key] = weakref.ref(self, lambda _, key=key, layers=registry.layers: layers.pop(key, None))
        self.outliers = self.keep = None
        if n_out:
            if n_out > MAX_OUTLIERS:
                raise SpecboundError(f"at most {MAX_OUTLIERS} outlier channels keep their products exact, got {n_out}")
            outliers = outliers.detach().to(torch.long).reshape(-1)
            keep = torch.ones(self.in_features, dtype=torch.bool)
            keep[outliers] = False
            self.outliers, self.keep = outliers.clone(), keep.nonzero().reshape(-1)
            self.scale_outliers = _row_scales(scale_outliers, qweight.shape[0], "scale_outliers")
            # [n_out, out]: the int8 values as floats (integers), read by _exact_outliers
            self._outlier_columns = qweight_outliers.detach().float().t().contiguous()

    def _group(self, qweight: torch.Tensor, scale: torch.Tensor):
        """(scales, fbgemm-packed weight, anchor row) of one column group."""
        scale = _row_scales(scale, qweight.shape[0], "scale")
        anchor = torch.zeros(1, qweight.shape[1])
        anchor[0, 0], anchor[0, -1] = -1.0, 1.0
        return scale, _prepack(qweight, scale), anchor

    @classmethod
    def from_linear(cls, linear: nn.Linear, weights: str = "channel", activations: str = "token",
                    smooth: torch.Tensor | None = None, outliers: torch.Tensor | None = None,
                    bits: int | None = None) -> "Int8Linear":
        if weights not in WEIGHT_SCALES:
            raise SpecboundError(f"weight scales must be one of {WEIGHT_SCALES}, got {weights!r}")
        w = linear.weight.detach().float()
        if smooth is not None:
            w = w * smooth.float()[None, :]
        per_channel = weights == "channel"
        if outliers is None or outliers.numel() == 0:
            q, scale = _quantize_rows(w, per_channel)
            return cls(q, scale, linear.bias, smooth, activations, bits=bits)
        outliers = outliers.to(torch.long).reshape(-1)
        keep = torch.ones(w.shape[1], dtype=torch.bool)
        keep[outliers] = False
        q, scale = _quantize_rows(w[:, keep], per_channel)
        q_out, scale_out = _quantize_rows(w[:, outliers], per_channel)
        return cls(q, scale, linear.bias, smooth, activations, outliers, q_out, scale_out, bits=bits)

    @staticmethod
    def _unpack(packed) -> torch.Tensor:
        weight, _ = torch.ops.quantized.linear_unpack(packed)
        return weight.int_repr()

    @property
    def qweight(self) -> torch.Tensor:
        """The int8 weight values [out, in] of the main column group (fbgemm's layout unpacked)."""
        return self._unpack(self._packed)

    @property
    def qweight_outliers(self) -> torch.Tensor | None:
        return None if self.outliers is None else self._outlier_columns.t().to(torch.int8)

    @property
    def smooth(self) -> torch.Tensor | None:
        return None if self.inv_smooth is None else 1.0 / self.inv_smooth

    def dequantized_weight(self) -> torch.Tensor:
        """W as the layer uses it (float32, smoothing undone, column groups put back together)."""
        def scaled(q, scale):
            return q.float() * (scale[:, None] if scale.numel() > 1 else scale)

        main = scaled(self.qweight, self.scale)
        if self.outliers is None:
            w = main
        else:
            w = torch.empty(self.out_features, self.in_features)
            w[:, self.keep] = main
            w[:, self.outliers] = scaled(self.qweight_outliers, self.scale_outliers)
        return w if self.inv_smooth is None else w * self.inv_smooth[None, :]

    def _per_token(self, x: torch.Tensor) -> torch.Tensor:
        """Each row scaled to max |x| = 1, the anchor row fixing fbgemm's range to [-1, 1]; then
        each output row multiplied back by its row's max (see the module docstring). Under
        torch.compile the rows are built by a concatenation and the GEMM is the operator
        ``specbound::int8_gemm`` (fbgemm's packed weight cannot enter a graph): the same operations on
        the same values, so the same bits (tests/test_compiled.py)."""
        k = x.shape[0]
        m = x.abs().amax(1, keepdim=True).clamp_min_(1e-30)     # = the inf-norm, ~5x cheaper on CPU
        if torch.compiler.is_compiling():
            rows = torch.cat([x / m, self.anchor], 0)
            y = torch.ops.specbound.int8_gemm(rows, self.gemm_id, self.scale, self.reduce_range)
        else:
            rows = torch.empty(k + 1, x.shape[1])
            torch.div(x, m, out=rows[:k])
            rows[k] = self.anchor[0]
            y = torch.ops.quantized.linear_dynamic(rows, self._packed, self.reduce_range)
        return y[:k].mul_(m)

    def _exact_outliers(self, x: torch.Tensor) -> torch.Tensor:
        """The outlier channels' product: each row rounded to int8 steps of its own max|x| / 127
        (symmetric, 8 bits), times the int8 weight columns, summed in float32. Every term and partial
        sum is an integer below 2**24 (at most ``MAX_OUTLIERS`` columns × 127 × 127), so the sums are
        exact in any order — batch-invariant without fbgemm, and one small GEMM instead of a second
        quantised call (measured: 15-30% of a fused layer's time at k ≤ 8)."""
        m = x.abs().amax(1, keepdim=True).clamp_min_(1e-30)
        acc = torch.mm(torch.round(x * (127.0 / m)), self._outlier_columns)
        return acc.mul_(m * (1.0 / 127.0)).mul_(self.scale_outliers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features).float()
        if self.inv_smooth is not None:
            x = x * self.inv_smooth
        if self.activations == "token" and self.outliers is None:
            y = self._per_token(x)
        elif self.activations == "token":
            y = self._per_token(x.index_select(1, self.keep))
            y.add_(self._exact_outliers(x.index_select(1, self.outliers)))
        elif x.shape[0] == 1:              # x86's one-row int8 path is slow: read the row twice
            y = torch.ops.quantized.linear_dynamic(torch.cat([x, x]), self._packed, self.reduce_range)[:1]
        else:
            y = torch.ops.quantized.linear_dynamic(x.contiguous(), self._packed, self.reduce_range)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "per-channel" if self.scale.numel() > 1 else "per-tensor"
        extra = (", smoothed" if self.inv_smooth is not None else "") + \
            (f", {self.outliers.numel()} outlier channels apart" if self.outliers is not None else "")
        return (f"in_features={self.in_features}, out_features={self.out_features}, weights=int8 {kind}, "
                f"activations={self.bits}-bit per-{self.activations}{extra}")

    # fbgemm's packed weights are an opaque object: copy.deepcopy rebuilds the layer from its values
    def __deepcopy__(self, memo):
        return Int8Linear(self.qweight.clone(), self.scale.clone(), self.bias, self.smooth, self.activations,
                          self.outliers, self.qweight_outliers, None if self.outliers is None else self.scale_outliers,
                          self.bits)


def _concat_rows(layers: list[Int8Linear]) -> Int8Linear:
    """One :class:`Int8Linear` computing several layers that read the same input (their output
    rows stacked). Exact: rows are quantised independently, and the layers share the input's
    per-token scales and outlier channels, so each slice equals that layer's own output bit for bit."""
    first = layers[0]
    same = all(m.activations == first.activations and m.in_features == first.in_features
               and m.scale.numel() > 1 and (m.outliers is None) == (first.outliers is None)
               and (m.outliers is None or torch.equal(m.outliers, first.outliers))
               and (m.inv_smooth is None and first.inv_smooth is None) and m.bits == first.bits for m in layers)
    if not same:
        raise SpecboundError("only per-channel int8 layers with the same input handling can be fused")
    bias = None
    if any(m.bias is not None for m in layers):
        bias = torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in layers])
    extra = (None, None, None)
    if first.outliers is not None:
        extra = (first.outliers, torch.cat([m.qweight_outliers for m in layers]),
                 torch.cat([m.scale_outliers for m in layers]))
    return Int8Linear(torch.cat([m.qweight for m in layers]), torch.cat([m.scale for m in layers]), bias, None,
                      first.activations, *extra, bits=first.bits)


class _SharedInputSlice(nn.Module):
    """One of several layers replaced by a fused :class:`Int8Linear`: the first call with a given
    input computes all of them at once; the others read their slice of that result (or recompute,
    if called with another input)."""

    def __init__(self, fused: Int8Linear, start: int, stop: int, memo: dict):
        super().__init__()
        self.fused, self.start, self.stop, self.memo = fused, start, stop, memo
        self.in_features, self.out_features = fused.in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.memo.get("input") is not x:
            self.memo["input"], self.memo["output"] = x, self.fused(x)
        return self.memo["output"][..., self.start:self.stop].contiguous()


def fuse_shared_inputs(model: nn.Module, groups=(("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))) -> int:
    """Compute the int8 layers that read one input (attention's q/k/v, the MLP's gate/up) with one
    GEMM each: fewer calls and one per-token prologue instead of three (or two). Exact. Returns the
    number of groups fused. Apply after loading; :func:`save_int8` writes unfused models only."""
    count = 0
    for module in list(model.modules()):
        for names in groups:
            layers = [getattr(module, n, None) for n in names]
            if not all(isinstance(m, Int8Linear) for m in layers):
                continue
            try:
                fused = _concat_rows(layers)
            except SpecboundError:
                continue
            share_input(module, names, layers, fused)
            count += 1
    trim_heap()
    return count


def share_input(module: nn.Module, names, layers, fused: nn.Module) -> None:
    """Replace ``module``'s layers ``names`` (the modules ``layers``, which read one input) by slices of
    ``fused``, one layer whose output rows are theirs stacked in that order."""
    memo: dict = {}
    start = 0
    for name, layer in zip(names, layers):
        setattr(module, name, _SharedInputSlice(fused, start, start + layer.out_features, memo))
        start += layer.out_features


# ----------------------------------------------------------------- batch invariance of the float parts
def _invariant_sdpa(module, query, key, value, attention_mask, **kwargs):
    """Hugging Face's SDPA attention computed in float64 and rounded back to float32.

    The CPU attention kernels sum in an order that depends on how many queries a call has, so a
    token's attention output differs by ~1e-6 between a one-token read and a k-token read. In an
    int8 model every such difference can move a per-token rounding by one step, and 28 layers turn
    that into ~1 logit: greedy speculative output would drift from the model's own greedy decoding.
    In float64 the order-dependent error is ~1e-16, far below float32's rounding, so the float32
    result is the same however many queries are read (measured and tested)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = attention_mask.double() if attention_mask is not None and attention_mask.is_floating_point() \
        else attention_mask
    out, weights = sdpa_attention_forward(module, query.double(), key.double(), value.double(), mask, **kwargs)
    return out.to(query.dtype), weights


class InvariantRMSNorm(nn.Module):
    """RMSNorm whose mean of squares is summed in float64 (then rounded to float32), so a row's result
    does not depend on how a reduction is split across rows or threads."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.double().pow(2).mean(-1, keepdim=True).float()
        return self.weight * (x.float() * torch.rsqrt(variance + self.variance_epsilon)).to(x.dtype)


ATTENTION_NAME = "specbound_invariant"


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Make the float parts of an int8 model independent of how many tokens a forward reads: attention
    in float64 (registered as the ``specbound_invariant`` attention implementation) and RMSNorms
    reduced in float64. The int8 GEMMs already are (exact int32 sums, per-token scales). Elementwise
    operations (rotary, SiLU, residual adds) are per element. In place; returns the model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, _invariant_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])   # SDPA's masks
    for config in {id(c): c for c in (model.config, getattr(model.config, "text_config", None)) if c}.values():
        config._attn_implementation = ATTENTION_NAME
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RMSNorm") and hasattr(child, "weight") and \
                    hasattr(child, "variance_epsilon") and not isinstance(child, InvariantRMSNorm):
                setattr(parent, name, InvariantRMSNorm(child.weight, child.variance_epsilon))
    return model


class Int8Embedding(nn.Module):
    """Token embedding stored as int8 rows with one float32 scale per row (gathered, then scaled)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, padding_idx: int | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.ndim != 2 or scale.numel() != qweight.shape[0]:
            raise SpecboundError("Int8Embedding needs int8 rows [vocab, dim] and one scale per row")
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.padding_idx = padding_idx
        self.register_buffer("qweight", qweight.contiguous(), persistent=False)
        self.register_buffer("scale", scale.detach().float().reshape(-1).contiguous(), persistent=False)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> "Int8Embedding":
        q, scale = _quantize_rows(embedding.weight, per_channel=True)
        return cls(q, scale, embedding.padding_idx)

    @property
    def weight(self) -> torch.Tensor:   # what code that reads ``embed_tokens.weight`` (dtype, device) sees
        return self.scale[:1]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[ids].float() * self.scale[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, weights=int8 per-row"


def _linears(model: nn.Module):
    """(parent, attribute name, qualified name, module) of every plain ``nn.Linear``."""
    for qualified, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                yield parent, name, f"{qualified}.{name}" if qualified else name, child


def activation_absmax(model: nn.Module, token_batches) -> dict[str, torch.Tensor]:
    """max |x_j| per input channel of every ``nn.Linear``, over the calibration ``token_batches``
    (LongTensors [1, n]), read with the float model."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for _, _, qualified, linear in _linears(model):
        def hook(module, inputs, key=qualified):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0).float()
            stats[key] = x if key not in stats else torch.maximum(stats[key], x)
        hooks.append(linear.register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            for ids in token_batches:
                model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return stats


def smoothing_factors(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's s_j = max|x_j|^α / max|w_j|^(1−α), clamped to [1e-2, 1e2] and normalised to a
    geometric mean of 1 (Xiao et al. 2023, Eq. 4)."""
    w = weight.detach().float().abs().amax(dim=0).clamp_min(1e-8)
    a = act_absmax.float().clamp_min(1e-8)
    s = (a.pow(alpha) / w.pow(1 - alpha)).clamp(1e-2, 1e2)
    return s / s.log().mean().exp()


def outlier_channels(absmax: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` input channels with the largest calibrated max |x_j| (sorted indices)."""
    count = min(int(count), absmax.numel() - 2)
    return absmax.float().topk(count).indices.sort().values if count > 0 else torch.zeros(0, dtype=torch.long)


def quantize_int8(model: nn.Module, weights: str = "channel", activations: str = "token",
                  smooth: dict[str, torch.Tensor] | None = None, alpha: float = 0.5,
                  embedding: bool = True, absmax: dict[str, torch.Tensor] | None = None,
                  outliers: int = 0, activation_bits: int | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` by an :class:`Int8Linear` (in place; returns the model).

    ``smooth`` maps a linear's qualified name to its calibrated max|x_j| (:func:`activation_absmax`);
    those layers are smoothed with strength ``alpha``. ``absmax`` (same form) with ``outliers`` = n
    puts each layer's n input channels of largest calibrated max|x_j| in a group of their own.
    ``embedding`` also stores the input embedding as int8 rows. ``activation_bits`` (7 or 8; default:
    :func:`activation_bits`, this CPU's best) is the activation precision. Pages of replaced weights
    are returned to the OS as layers are converted.
    """
    if not int8_available():
        raise SpecboundError("int8 kernels need a torch build with fbgemm (x86 CPUs); use the fp32 model")
    shared: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):    # a tied weight counts twice
        shared[p.data_ptr()] = shared.get(p.data_ptr(), 0) + 1
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for parent, name, qualified, linear in list(_linears(model)):
            factors = picked = None
            if smooth is not None and qualified in smooth:
                factors = smoothing_factors(smooth[qualified], linear.weight, alpha)
            if outliers and absmax is not None and qualified in absmax:
                picked = outlier_channels(absmax[qualified], outliers)
            setattr(parent, name, Int8Linear.from_linear(linear, weights, activations, factors, picked, activation_bits))
            if shared.get(linear.weight.data_ptr(), 0) == 1:
                _release_pages(linear.weight.data)
        if embedding:
            _quantize_embedding(model, shared)
    trim_heap()
    return model


def _quantize_embedding(model: nn.Module, shared: dict[int, int]) -> None:
    get, set_ = getattr(model, "get_input_embeddings", None), getattr(model, "set_input_embeddings", None)
    if get is None or set_ is None or type(get()) is not nn.Embedding:
        return
    old = get()
    set_(Int8Embedding.from_embedding(old))
    if shared.get(old.weight.data_ptr(), 0) == 1:
        _release_pages(old.weight.data)


# ---------------------------------------------------------------------------------- on disk
def _state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor needed to rebuild ``model`` and a JSON description of its int8 layers."""
    tensors: dict[str, torch.Tensor] = {}
    layers: dict[str, dict] = {}
    int8_modules = set()
    for qualified, module in model.named_modules():
        if isinstance(module, Int8Linear):
            int8_modules.add(qualified)
            tensors[f"{qualified}.qweight"] = module.qweight.contiguous()
            tensors[f"{qualified}.scale"] = module.scale.contiguous()
            if module.bias is not None:
                tensors[f"{qualified}.bias"] = module.bias.contiguous()
            if module.inv_smooth is not None:
                tensors[f"{qualified}.smooth"] = module.smooth.contiguous()
            if module.outliers is not None:
                tensors[f"{qualified}.outliers"] = module.outliers.contiguous()
                tensors[f"{qualified}.qweight_outliers"] = module.qweight_outliers.contiguous()
                tensors[f"{qualified}.scale_outliers"] = module.scale_outliers.contiguous()
            layers[qualified] = {"kind": "linear", "activations": module.activations}
        elif isinstance(module, Int8Embedding):
            int8_modules.add(qualified)
            tensors[f"{qualified}.qweight"] = module.qweight
            tensors[f"{qualified}.scale"] = module.scale
            layers[qualified] = {"kind": "embedding", "padding_idx": module.padding_idx}
    for name, p in model.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner not in int8_modules and name not in tensors:
            tensors[name] = p.detach().contiguous()
    return tensors, layers


def save_int8(model: nn.Module, tokenizer, directory: Path, info: dict | None = None) -> None:
    """Write a quantised model into ``directory``: ``int8.safetensors``, ``int8.json`` (format, layers,
    ``info``), the model's config and the tokenizer files."""
    from safetensors.torch import save_file

    if any(isinstance(m, _SharedInputSlice) for m in model.modules()):
        raise SpecboundError("save_int8 writes unfused models: save before fuse_shared_inputs")
    directory = Path(directory)
    tensors, layers = _state(model)
    save_file(tensors, str(directory / "int8.safetensors"), metadata={"format": INT8_FORMAT})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(directory))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    (directory / "int8.json").write_text(json.dumps({"format": INT8_FORMAT, "layers": layers, **(info or {})},
                                                    indent=1), encoding="utf-8")


def read_int8_description(directory: Path) -> dict:
    """``int8.json`` of a quantised directory, validated (format tag, layer table)."""
    path = Path(directory) / "int8.json"
    try:
        desc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecboundError(f"{path}: unreadable int8 description ({exc})") from None
    if not isinstance(desc, dict) or desc.get("format") != INT8_FORMAT or not isinstance(desc.get("layers"), dict):
        raise SpecboundError(f"{path}: not a {INT8_FORMAT} description")
    return desc


def load_int8(directory: Path):
    """``(model, tokenizer)`` from a directory written by :func:`save_int8`, without ever building
    the float weights (the module tree is made on the meta device; int8 layers are filled from the
    file and the file's pages are returned to the OS once packed)."""
    from accelerate import init_empty_weights
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    desc = read_int8_description(directory)
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    float_state = {}
    with safe_open(str(directory / "int8.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for qualified, layer in desc["layers"].items():
            parent_name, _, attr = qualified.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            q, scale = f.get_tensor(f"{qualified}.qweight"), f.get_tensor(f"{qualified}.scale")
            if layer["kind"] == "linear":
                bias = f.get_tensor(f"{qualified}.bias") if f"{qualified}.bias" in names else None
                smooth = f.get_tensor(f"{qualified}.smooth") if f"{qualified}.smooth" in names else None
                extra = [f.get_tensor(f"{qualified}.{k}") if f"{qualified}.outliers" in names else None
                         for k in ("outliers", "qweight_outliers", "scale_outliers")]
                module = Int8Linear(q, scale, bias, smooth, layer.get("activations", "token"), *extra)
                _release_pages(q)                       # packed now: the file's pages are not needed again
            elif layer["kind"] == "embedding":
                module = Int8Embedding(q.clone(), scale, layer.get("padding_idx"))
                _release_pages(q)
            else:
                raise SpecboundError(f"{directory}: unknown int8 layer kind {layer['kind']!r}")
            setattr(parent, attr, module)
        owned = {f"{q}.{suffix}" for q in desc["layers"]
                 for suffix in ("qweight", "scale", "bias", "smooth", "outliers", "qweight_outliers", "scale_outliers")}
        for name in names - owned:
            float_state[name] = f.get_tensor(name)
    missing = [n for n, p in model.named_parameters() if p.is_meta and n not in float_state]
    if missing:
        raise SpecboundError(f"{directory}: int8.safetensors lacks {len(missing)} tensors (e.g. {missing[0]})")
    model.load_state_dict(float_state, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False    # the int8 output layer has its own tensor
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    trim_heap()
    return model.eval(), tokenizer
