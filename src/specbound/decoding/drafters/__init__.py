"""Drafters: small proposers behind the one decoding loop (as Hugging Face's candidate generators).

=============  ===============================================  ============================
drafter         proposal per round                               verification rule
=============  ===============================================  ============================
chain           γ sampled tokens (γ fixed, to the horizon, auto)  sampled chain (Alg. 1)
batch           M sampled branches (Yin et al. 2024, Alg. 4)      recursive rejection (A / B)
dynamic         top-P tree by draft path probability              deterministic tree walk
sampled         i.i.d. sampled children per node                  recursive rejection
oracle          T*(P) of the target itself                        deterministic tree walk
shape           chain / 2 drafts / sampled tree, chosen online    the chosen shape's rule
=============  ===============================================  ============================
"""
from ...errors import SpecboundError
from .base import DraftCache, Drafter, RoundFeedback
from .batch import BATCH_DESIGNS, BatchDrafter, check_batch_gamma, check_design, check_drafts
from .chain import ChainDrafter, check_gamma
from .oracle import OracleTreeDrafter, TargetLaws, draft_tree_from_optimal
from .trees import DynamicTreeDrafter, SampledTreeDrafter, check_tree_capacity
from .shapes import SHAPES, ShapeDrafter, check_shape

__all__ = [
    "AUTO_TREE_CAPACITY", "BATCH_DESIGNS", "BatchDrafter", "ChainDrafter", "DraftCache", "Drafter", "DynamicTreeDrafter",
    "OracleTreeDrafter", "RoundFeedback", "SampledTreeDrafter", "TREE_DRAFTERS", "TargetLaws", "check_batch_gamma",
    "check_design", "check_drafts", "check_gamma", "check_tree_capacity", "check_tree_drafter", "draft_tree_from_optimal",
    "make_tree_drafter", "SHAPES", "ShapeDrafter", "check_shape",
]

TREE_DRAFTERS = ("dynamic", "sampled", "chain", "oracle")


AUTO_TREE_CAPACITY = 64


def check_tree_drafter(name, capacity):
    """A tree drafter's name (one of :data:`TREE_DRAFTERS`) and its capacity P (an integer ≥ 1, or
    "auto" for the dynamic drafter); returns the capacity."""
    if not isinstance(name, str) or name not in TREE_DRAFTERS:
        raise SpecboundError(f"tree_drafter must be one of {', '.join(map(repr, TREE_DRAFTERS))}, got {name!r}")
    if capacity == "auto":
        if name != "dynamic":
            raise SpecboundError(f"tree='auto' sizes the dynamic tree drafter; tree_drafter={name!r} needs a fixed P")
        return capacity
    return check_tree_capacity(capacity)


def make_tree_drafter(name, target, draft, sampling, capacity) -> Drafter:
    """The tree drafter called ``name`` (one of :data:`TREE_DRAFTERS`) with capacity P = ``capacity``;
    ``"chain"`` is one sampled chain of P tokens (for comparison with real trees). ``capacity="auto"``
    (dynamic drafter only) sizes the tree every round with the cost model, up to 64 nodes."""
    capacity = check_tree_drafter(name, capacity)
    if capacity == "auto":
        if draft is None:
            raise SpecboundError("the dynamic tree drafter needs a draft model")
        return DynamicTreeDrafter(draft, sampling, AUTO_TREE_CAPACITY, budget="auto")
    if name == "oracle":
        return OracleTreeDrafter(target, sampling, capacity)
    if draft is None:
        raise SpecboundError(f"tree_drafter={name!r} needs a draft model (only 'oracle' drafts with the target)")
    if name == "dynamic":
        return DynamicTreeDrafter(draft, sampling, capacity)
    if name == "sampled":
        return SampledTreeDrafter(draft, sampling, capacity)
    return SampledTreeDrafter(draft, sampling, capacity, branching=(1,))
