"""THE verification core: one entry, :func:`verify`, over a :class:`~specbound.decoding.tree.DraftTree`.

Pure tensor functions, no model calls, allocations on the device of the inputs. Vocabulary (as in
vLLM's rejection sampler): a drafted token is *accepted* with probability b = min(1, target/draft);
the first rejected position gets a *recovered* token drawn from the residual [target − b·draft]_+
(normalised); when the walk ends at a leaf the target's law there gives a free *bonus* token. Three
rules, chosen by the tree: a sampled chain (Yin et al. 2024, Alg. 1; any :class:`AcceptanceRule` of the
Alg. 2 family; :data:`BLOCK`, block verification, Sun et al. 2025); a sampled tree (recursive rejection
over siblings, Yin et al. Alg. 4 / SpecInfer: batch design B, design A with ``pool_equal_prefixes``); a
deterministic tree (the target walk, Pankratov & Alistarh 2026, §1). The :class:`Verdict` carries the
accepted path, the recovered/bonus token and, per tested depth, the acceptance probability and the exact
TV bias of the step, so analyses read them instead of patching rules. NumPy twins of the formulas live in
:mod:`specbound.theory` and are cross-checked in the tests. In full: docs/notes.md (`decoding/verify.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from ..errors import SpecboundError
from ..theory.tradeoff import OVER_ACCEPTANCE_FORMS
from .sampling import sample_from
from .tree import DraftTree

__all__ = [
    "AcceptanceRule", "BLOCK", "BlockVerification", "CandidatesVerdict", "DecodingOPT", "DecodingUNO", "RELAXATIONS",
    "RelaxedAcceptance", "RoundEnd", "STANDARD", "Verdict", "acceptance_probability", "over_acceptance_probability", "parse_relaxation",
    "recursive_rejection_sampling", "residual_distribution", "step_output_bias", "verify", "VERIFICATIONS",
    "parse_verification",
    "resolve_verification",
]


# ---------------------------------------------------------------------------------------------------
# the formulas (target first, then draft; keyword-only where the two share a shape)
# ---------------------------------------------------------------------------------------------------
def _tiny(x: torch.Tensor) -> float:
    return torch.finfo(x.dtype).tiny


def acceptance_probability(*, target: torch.Tensor, draft: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """b(x) = min(1, target(x)/draft(x)) at the drafted tokens x (Yin et al. 2024, Alg. 1).

    ``target``/``draft`` are processed laws [..., V]; ``tokens`` [...] were sampled from ``draft``,
    so draft(x) > 0 and nothing divides by zero.
    """
    t = target.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    d = draft.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(d > 0, (t / d.clamp_min(_tiny(d))).clamp(max=1.0), torch.ones_like(t))


def residual_distribution(*, target: torch.Tensor, draft: torch.Tensor,
                          accept: torch.Tensor | None = None) -> torch.Tensor:
    """[target − b·draft]_+ normalised; b = min(1, target/draft) when ``accept`` is None.

    Same formula as :func:`specbound.theory.residual` (standard SD, the unbiased family of Thm 2,
    and the optimal residual P* of Thm 4, Yin et al. 2024). Rows without positive mass fall back to
    the target.
    """
    excess = (target - draft).clamp_min(0) if accept is None else (target - accept * draft).clamp_min(0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp_min(_tiny(excess)), target)


def over_acceptance_probability(*, target: torch.Tensor, draft: torch.Tensor, eps: float,
                                form: str = "additive") -> torch.Tensor:
    """Full-vocabulary over-acceptance b ≥ min(1, target/draft) (Yin et al. 2024, §5; Thm 5).

    ``form="additive"``: b = min(1, (target + ε)/draft); ``form="ratio"``: b = min(1, target/draft + ε).
    b = 1 where the draft has no mass. ε = 0 is standard SD. NumPy twin:
    :func:`specbound.theory.tradeoff.over_acceptance`.
    """
    if form not in OVER_ACCEPTANCE_FORMS:
        raise SpecboundError(f"over-acceptance form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
    safe = draft.clamp_min(_tiny(draft))
    ratio = (target + eps) / safe if form == "additive" else target / safe + eps
    return torch.where(draft > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))


def step_output_bias(*, target: torch.Tensor, draft: torch.Tensor, accept: torch.Tensor,
                     resample: torch.Tensor) -> torch.Tensor:
    """Loss_TV(b, P) = TV(draft·b + (1 − β)·P, target), β = Σ draft·b (Yin et al. 2024, Thm 4), over [..., V]."""
    beta = (draft * accept).sum(dim=-1, keepdim=True)
    return 0.5 * (draft * accept + (1.0 - beta) * resample - target).abs().sum(dim=-1)


# ---------------------------------------------------------------------------------------------------
# acceptance rules: the rejection-based family (Yin et al. 2024, Alg. 2) and its relaxations (§5)
# ---------------------------------------------------------------------------------------------------
class AcceptanceRule:
    """A member of the rejection-based family (Yin et al. 2024, Alg. 2): acceptance b and resampling law.

    The base class is standard SD. Subclasses override :meth:`acceptance` (full-vocabulary b [..., V])
    and, if needed, :meth:`resample_law`; ``lossless`` says whether the output law is the target's.
    """

    lossless: bool = True
    name: str = "standard"

    def acceptance(self, *, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        ratio = target / draft.clamp_min(_tiny(draft))
        return torch.where(draft > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))

    def resample_law(self, *, target: torch.Tensor, draft: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
        return residual_distribution(target=target, draft=draft, accept=accept)

    def step_bias(self, *, target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """Exact TV bias of one step of this rule at each row [...] (Yin et al. 2024, Thm 4); 0 if lossless."""
        if self.lossless:
            return target.new_zeros(target.shape[:-1])
        accept = self.acceptance(target=target, draft=draft)
        return step_output_bias(target=target, draft=draft, accept=accept,
                                resample=self.resample_law(target=target, draft=draft, accept=accept))

    def describe(self) -> str:
        return self.name


STANDARD = AcceptanceRule()


class RelaxedAcceptance(AcceptanceRule):
    """Over-accepting (biased) rule (Yin et al. 2024, §5, Thm 4/5): b = :func:`over_acceptance_probability`.

    Fewer rejections than standard SD (1 − Σ draft·b) at a TV bias per step of :meth:`step_bias`;
    for Decoding-OPT the two add up to TV(draft, target) (Thm 5).
    """

    lossless = False
    name = "relaxed"

    def __init__(self, eps: float, form: str = "additive"):
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise SpecboundError(f"eps (over-acceptance threshold) must be a finite number >= 0, got {eps!r}")
        if form not in OVER_ACCEPTANCE_FORMS:
            raise SpecboundError(f"over-acceptance form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
        self.eps, self.form = float(eps), form

    def acceptance(self, *, target, draft):
        return over_acceptance_probability(target=target, draft=draft, eps=self.eps, form=self.form)

    def describe(self) -> str:
        return f"{self.name}(eps={self.eps:g}, {self.form})"


class DecodingOPT(RelaxedAcceptance):
    """Decoding-OPT: over-acceptance b, resampling from P* = [target − b·draft]_+ normalised
    (Yin et al. 2024, Thm 4: the least TV bias Σ[b·draft − target]_+ for this b)."""

    name = "opt"


class DecodingUNO(RelaxedAcceptance):
    """Decoding-UNO: the same b as OPT (same rejections), resampling from the target itself
    (Yin et al. 2024, §5): bias ½Σ|draft·b − β·target| ≥ OPT's."""

    name = "uno"

    def resample_law(self, *, target, draft, accept):
        return target


RELAXATIONS = {"opt": DecodingOPT, "uno": DecodingUNO}


class BlockVerification:
    """Block verification of a sampled draft chain (Sun et al. 2025, *Block Verification Accelerates
    Speculative Decoding*, Alg. 2): the chain is kept up to τ = max{i : η_i ≤ h_i}, where the
    stopping probabilities h_i depend on the whole drafted block through the weights
    p_i = min(1, p_{i−1}·target/draft) (:mod:`specbound.theory.verification` holds the formulas and
    the exact expected accepted tokens). Lossless; never fewer accepted tokens in expectation than
    token-wise verification. Not a member of Yin et al.'s rejection-based family (the decision at
    position i reads later tokens). Deterministic (greedy) trees are walked as with the standard rule."""

    lossless = True
    name = "block"

    def describe(self) -> str:
        return "block verification"


BLOCK = BlockVerification()
VERIFICATIONS = ("token", "block", "auto")


def resolve_verification(verification: str, chain: bool, relaxed: bool) -> str:
    """``"auto"`` → ``"block"`` where block verification applies (one drafted chain, no relaxation),
    else ``"token"``; ``"token"`` and ``"block"`` are returned as given. Block verification is chosen
    where it applies because its expected accepted tokens per round are never below token-wise
    verification's for the same drafted block (Sun et al. 2025, Thm 2) at the same target pass; at
    greedy the two rules are the same."""
    if verification not in VERIFICATIONS:
        raise SpecboundError(f"verification must be one of {', '.join(map(repr, VERIFICATIONS))}, got {verification!r}")
    if verification == "auto":
        return "block" if chain and not relaxed else "token"
    return verification


def parse_verification(verification: str) -> "AcceptanceRule | BlockVerification":
    """``"token"`` (default: token-wise, Yin et al. 2024 Alg. 1) or ``"block"`` (Sun et al. 2025 Alg. 2);
    ``"auto"`` must be resolved first (:func:`resolve_verification`)."""
    if verification not in VERIFICATIONS or verification == "auto":
        raise SpecboundError(f"verification must be 'token' or 'block' here, got {verification!r}")
    return BLOCK if verification == "block" else STANDARD


def parse_relaxation(relaxation) -> AcceptanceRule:
    """``None`` → standard SD; ``(name, eps)`` / ``(name, eps, form)`` or "opt:0.1" → a relaxed rule.

    ``name`` is "opt" (Decoding-OPT) or "uno" (Decoding-UNO); ``eps`` ≥ 0; ``form`` "additive"
    (default, b = min(1, (target+ε)/draft)) or "ratio" (b = min(1, target/draft + ε)).
    """
    if relaxation is None:
        return STANDARD
    if isinstance(relaxation, AcceptanceRule):
        return relaxation
    if isinstance(relaxation, str):
        parts = relaxation.split(":")
        if len(parts) in (2, 3):
            try:
                relaxation = (parts[0], float(parts[1]), *parts[2:])
            except ValueError:
                pass
    if isinstance(relaxation, str) or not isinstance(relaxation, (tuple, list)) or len(relaxation) not in (2, 3):
        raise SpecboundError(
            f"relaxation must be None, 'name:eps[:form]' or a tuple (name, eps[, form]) with name in "
            f"{sorted(RELAXATIONS)}, e.g. ('opt', 0.1) or 'opt:0.1'; got {relaxation!r}"
        )
    name, eps, *rest = relaxation
    key = name.lower() if isinstance(name, str) else name
    if key not in RELAXATIONS:
        raise SpecboundError(f"unknown relaxation {name!r}: use one of {sorted(RELAXATIONS)} (Decoding-OPT / -UNO)")
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise SpecboundError(f"relaxation eps must be a number >= 0, got {eps!r}") from None
    return RELAXATIONS[key](eps, rest[0] if rest else "additive")


# ---------------------------------------------------------------------------------------------------
# recursive rejection sampling over i.i.d. candidates at one position (Yin et al. 2024, Alg. 4, Thm 3)
# ---------------------------------------------------------------------------------------------------
@dataclass
class CandidatesVerdict:
    """Per row: index of the accepted candidate (−1: all rejected), the residual law after the
    rejected ones (the recovered token's law when all were rejected), and P(all rejected | candidates)."""

    accepted: torch.Tensor       # [B]
    residual: torch.Tensor       # [B, V]
    all_rejected: torch.Tensor   # [B]


def recursive_rejection_sampling(candidates: torch.Tensor, *, target: torch.Tensor, draft: torch.Tensor,
                                 generator: torch.Generator | None = None,
                                 alive: torch.Tensor | None = None) -> CandidatesVerdict:
    """Recursive rejection sampling over M i.i.d. draft candidates at one position (Yin et al. 2024, Alg. 4, Thm 3).

    ``candidates`` [B, M] were sampled i.i.d. from ``draft`` [B, V]; ``target`` [B, V]. Starting from
    r = target, candidate m (in index order) is accepted with probability min(1, r(x_m)/draft(x_m));
    on rejection r ← [r − draft]_+ normalised. The emitted token has the target's law exactly, and
    all M are rejected with probability ρ_M = Π_k TV(draft, r^k) (NumPy twin:
    :func:`specbound.theory.residual_chain`). ``alive`` [B, M] restricts the test to some candidates
    (design A). One uniform is drawn per candidate slot and row, tested or not.
    """
    if candidates.ndim != 2 or draft.ndim != 2 or target.shape != draft.shape or candidates.shape[0] != draft.shape[0]:
        raise SpecboundError(
            f"recursive_rejection_sampling needs candidates [B, M] and target/draft laws [B, V]; got "
            f"{tuple(candidates.shape)}, {tuple(target.shape)}, {tuple(draft.shape)}"
        )
    batch, m = candidates.shape
    if alive is not None and tuple(alive.shape) != (batch, m):
        raise SpecboundError(f"alive must be [B, M] = {(batch, m)}, got {tuple(alive.shape)}")
    draft = draft.to(target.dtype)
    residual = target
    accepted = torch.full((batch,), -1, dtype=torch.long, device=target.device)
    all_rejected = torch.ones(batch, dtype=target.dtype, device=target.device)
    for j in range(m):
        testing = accepted < 0
        if alive is not None:
            testing = testing & alive[:, j]
        uniforms = torch.rand((batch,), generator=generator, dtype=residual.dtype, device=residual.device)
        if not bool(testing.any()):
            continue
        ratio = acceptance_probability(target=residual, draft=draft, tokens=candidates[:, j])
        all_rejected = torch.where(testing, all_rejected * (1 - ratio), all_rejected)
        ok = testing & (uniforms < ratio)
        accepted = torch.where(ok, torch.full_like(accepted, j), accepted)
        rejected = testing & ~ok
        if bool(rejected.any()):
            residual = torch.where(rejected.unsqueeze(-1), residual_distribution(target=residual, draft=draft), residual)
    return CandidatesVerdict(accepted=accepted, residual=residual, all_rejected=all_rejected)


# ---------------------------------------------------------------------------------------------------
# THE entry
# ---------------------------------------------------------------------------------------------------
class RoundEnd(StrEnum):
    """How a round ended (vLLM's words): a drafted token was rejected and a *recovered* token drawn
    from the residual; every tested drafted token was accepted and the target's law after the last
    one gave a free *bonus* token; or the walk reached a node the target did not read because the
    generation *budget* ends there (no next token). Values compare equal to their strings."""

    RECOVERED = "recovered"
    BONUS = "bonus"
    BUDGET = "budget"


@dataclass
class Verdict:
    """Outcome of verifying one draft tree.

    ``path``: accepted nodes (tree indices, root → node); X = len(path). ``next_token``: the
    recovered (``ended is RoundEnd.RECOVERED``) or bonus (``RoundEnd.BONUS``) token, −1 when the walk
    reached a node without a target law (``RoundEnd.BUDGET``). Per tested depth (the depths where
    drafted tokens were checked, len(path) + 1 if recovered else len(path)): ``accept_probs`` — the
    probability that some drafted token at that depth is accepted, given the drafted tokens — and
    ``bias`` — the exact TV distance between the step's output law and the target's (0 if lossless).
    ``block_accept_probs`` (block verification of a chain only, else None): for EVERY drafted depth
    i = 1..k, P(τ ≥ i | τ ≥ i − 1, drafted block) — exact given the block, whatever the coins drew, so
    a drafter can learn from all of them (as it learns min(1, p/q) from every node under token-wise
    verification).
    """

    path: list[int]
    next_token: int
    ended: RoundEnd
    accept_probs: list[float] = field(default_factory=list)
    bias: list[float] = field(default_factory=list)
    block_accept_probs: list[float] | None = None

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def rejected(self) -> bool:
        return self.ended is RoundEnd.RECOVERED


def _draw(law: torch.Tensor, generator) -> int:
    """One token from ``law``; a point mass (greedy) is read off without sampling (same token, no RNG)."""
    top, index = law.max(dim=-1)
    if float(top) == 1.0:
        return int(index)
    return int(sample_from(law, generator))


def verify(tree: DraftTree, target_probs: torch.Tensor, law_mask: torch.Tensor | None = None,
           rule: "AcceptanceRule | BlockVerification" = STANDARD, generator: torch.Generator | None = None) -> Verdict:
    """Lossless (or, with a relaxed ``rule``, deliberately biased) verification of one draft tree.
    ``rule=BLOCK`` verifies a sampled chain jointly (block verification); greedy trees are unchanged.

    ``target_probs`` [n+1, V]: the target's processed law at the root (row 0) and after node i (row
    i+1). ``law_mask`` [n+1] (bool, optional) marks rows that hold a law; a walk reaching a node
    without one ends with :attr:`RoundEnd.BUDGET`. A non-standard ``rule`` needs a sampled chain (the
    rejection-based family of Yin et al. 2024 is defined one draft per position).
    """
    n = len(tree)
    if target_probs.ndim != 2 or target_probs.shape[0] != n + 1:
        raise SpecboundError(f"target_probs must be [n+1, V] = [{n + 1}, V] for a tree of {n} nodes, "
                             f"got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[1]
    if n and (int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab):
        raise SpecboundError(f"draft tree has token ids outside [0, {vocab})")
    has_law = [True] * (n + 1) if law_mask is None else [bool(x) for x in law_mask.reshape(-1).tolist()]
    if len(has_law) != n + 1:
        raise SpecboundError(f"law_mask must have n+1 = {n + 1} entries, got {len(has_law)}")
    if not has_law[0]:
        raise SpecboundError("verify needs the target law at the root (law_mask[0] is False)")
    for parent in set(tree.parents.tolist()):
        if not has_law[parent + 1]:
            raise SpecboundError(f"draft tree node {parent} has children but no target law (law_mask is False)")
    if rule is BLOCK and tree.sampled and not tree.is_chain():
        raise SpecboundError("block verification applies to a sampled draft chain, not to sampled trees or batch drafts")
    if rule is BLOCK and not tree.sampled:
        rule = STANDARD                       # a deterministic (greedy) tree: the target walk is the same
    if rule is not STANDARD and rule is not BLOCK and not (tree.sampled and tree.is_chain()):
        raise SpecboundError(f"the {rule.describe()} rule applies to a sampled draft chain (one draft per position), "
                             "not to trees or batch drafts")
    if n == 0:
        return Verdict([], _draw(target_probs[0], generator), RoundEnd.BONUS)
    if tree.sampled:
        draft_probs = tree.draft_probs.to(device=target_probs.device, dtype=target_probs.dtype)
        if draft_probs.shape != target_probs.shape:
            raise SpecboundError(f"draft_probs {tuple(draft_probs.shape)} must match target_probs "
                                 f"{tuple(target_probs.shape)}")
        at_parent = draft_probs[tree.parents.to(draft_probs.device) + 1, tree.tokens.to(draft_probs.device)]
        if not bool((at_parent > 0).all()):
            bad = int((at_parent <= 0).nonzero()[0])
            raise SpecboundError(f"draft tree node {bad} (token {int(tree.tokens[bad])}) has draft probability 0 at "
                                 "its parent: sampled children must be drawn from draft_probs")
        if tree.is_chain() and rule is BLOCK:
            return _verify_block_chain(tree, draft_probs, target_probs, has_law, generator)
        if tree.is_chain():
            return _verify_sampled_chain(tree, draft_probs, target_probs, has_law, rule, generator)
        return _verify_sampled_tree(tree, draft_probs, target_probs, has_law, generator)
    return _verify_deterministic(tree, target_probs, has_law, generator)


def _verify_sampled_chain(tree, draft_probs, target_probs, has_law, rule, generator) -> Verdict:
    """Alg. 1 of Yin et al. 2024 along a chain, all positions at once."""
    k = len(tree)
    tokens = tree.tokens.to(target_probs.device)
    targets, drafts = target_probs[:k], draft_probs[:k]       # law before drafted token j
    if rule is STANDARD:
        ratio = acceptance_probability(target=targets, draft=drafts, tokens=tokens)
    else:
        accept_all = rule.acceptance(target=targets, draft=drafts)
        ratio = accept_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    uniforms = torch.rand(k, generator=generator, dtype=ratio.dtype, device=ratio.device)
    ok = (uniforms < ratio).to(torch.long)
    accepted = int(ok.cumprod(0).sum())
    tested = min(accepted + 1, k)
    accept_probs = ratio[:tested].tolist()
    bias = [0.0] * tested if rule.lossless else rule.step_bias(target=targets[:tested], draft=drafts[:tested]).tolist()
    path = list(range(accepted))
    if accepted < k:
        if rule is STANDARD:
            law = residual_distribution(target=targets[accepted], draft=drafts[accepted])
        else:
            law = rule.resample_law(target=targets[accepted], draft=drafts[accepted], accept=accept_all[accepted])
        return Verdict(path, _draw(law, generator), RoundEnd.RECOVERED, accept_probs, bias)
    if not has_law[k]:
        return Verdict(path, -1, RoundEnd.BUDGET, accept_probs, bias)
    return Verdict(path, _draw(target_probs[k], generator), RoundEnd.BONUS, accept_probs, bias)


def _verify_block_chain(tree, draft_probs, target_probs, has_law, generator) -> Verdict:
    """Block verification of a sampled chain (Sun et al. 2025, Alg. 2; NumPy twin:
    :func:`specbound.theory.verification.block_stop_probabilities`). ``accept_probs`` per tested depth
    i: P(τ ≥ i | τ ≥ i − 1, drafted block)."""
    k = len(tree)
    tokens = tree.tokens.to(target_probs.device)
    targets, drafts = target_probs[:k + 1].double(), draft_probs[:k].double()
    index = torch.arange(k, device=tokens.device)
    q = drafts[index, tokens]
    ratio = targets[index, tokens] / q          # q > 0: checked by verify()
    p = [1.0]
    for r in ratio.tolist():
        p.append(min(1.0, p[-1] * r))
    weights = torch.tensor(p[1:k], dtype=targets.dtype, device=targets.device)
    excess = (weights[:, None] * targets[1:k] - drafts[1:k]).clamp_min(0).sum(-1)          # S_1..S_{k-1}
    denominator = excess + 1.0 - weights
    inner = torch.where(denominator > 0, excess / denominator.clamp_min(_tiny(denominator)), torch.zeros_like(excess))
    h = [1.0] + inner.tolist() + [p[k]]                                                    # h_0..h_k
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64, device=targets.device).tolist()
    tau = max([0] + [i for i in range(1, k + 1) if uniforms[i - 1] <= h[i]])
    stay, reach = 1.0, [1.0] * (k + 2)           # reach[i] = P(τ ≥ i | block) = 1 − Π_{j ≥ i}(1 − h_j)
    for i in range(k, 0, -1):
        stay *= 1.0 - h[i]
        reach[i] = 1.0 - stay
    tested = min(tau + 1, k)
    survival = [reach[i] / reach[i - 1] if reach[i - 1] > 0 else 0.0 for i in range(1, k + 1)]
    accept_probs = survival[:tested]
    path = list(range(tau))
    if tau < k:
        law = (p[tau] * targets[tau] - drafts[tau]).clamp_min(0)
        mass = law.sum()
        law = (law / mass if mass > 0 else targets[tau]).to(target_probs.dtype)
        return Verdict(path, _draw(law, generator), RoundEnd.RECOVERED, accept_probs, [0.0] * tested, survival)
    if not has_law[k]:
        return Verdict(path, -1, RoundEnd.BUDGET, accept_probs, [0.0] * tested, survival)
    return Verdict(path, _draw(target_probs[k], generator), RoundEnd.BONUS, accept_probs, [0.0] * tested, survival)


def _verify_sampled_tree(tree, draft_probs, target_probs, has_law, generator) -> Verdict:
    """Recursive rejection over the siblings at each depth (batch design B; design A when pooled)."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    token_tensor = tree.tokens.to(target_probs.device)
    node, alive, path, accept_probs = -1, [-1], [], []
    while True:
        kids = [c for a in alive for c in children[a + 1]] if tree.pool_equal_prefixes else children[node + 1]
        if not kids:
            if not has_law[node + 1]:
                return Verdict(path, -1, RoundEnd.BUDGET, accept_probs, [0.0] * len(accept_probs))
            return Verdict(path, _draw(target_probs[node + 1], generator), RoundEnd.BONUS, accept_probs,
                           [0.0] * len(accept_probs))
        # siblings (or pooled candidates of design A) are i.i.d. draws from the draft law at the node
        verdict = recursive_rejection_sampling(token_tensor[kids].unsqueeze(0), target=target_probs[node + 1:node + 2],
                                               draft=draft_probs[node + 1:node + 2], generator=generator)
        accept_probs.append(float(1 - verdict.all_rejected[0]))
        won = int(verdict.accepted[0])
        if won < 0:
            return Verdict(path, _draw(verdict.residual[0], generator), RoundEnd.RECOVERED, accept_probs,
                           [0.0] * len(accept_probs))
        node = kids[won]
        path.append(node)
        if tree.pool_equal_prefixes:    # the accepted node's own ancestors carry the same tokens
            alive = [c for c in kids if tokens[c] == tokens[node]]
            path = tree.path_to(node)


def _verify_deterministic(tree, target_probs, has_law, generator) -> Verdict:
    """Target walk down a deterministic tree (Pankratov & Alistarh 2026, §1 step 3)."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, path, accept_probs = -1, [], []
    while True:
        slot, kids = node + 1, children[node + 1]
        if not has_law[slot]:
            return Verdict(path, -1, RoundEnd.BUDGET, accept_probs, [0.0] * len(accept_probs))
        by_token: dict[int, int] = {}
        for c in kids:
            if tokens[c] in by_token:
                raise SpecboundError(f"draft tree node {node} has two children with token {tokens[c]}: a deterministic "
                                     "tree needs distinct sibling tokens")
            by_token[tokens[c]] = c
        x = _draw(target_probs[slot], generator)
        if kids:
            accept_probs.append(float(target_probs[slot, list(by_token)].sum()))
        child = by_token.get(x)
        if child is None:
            ended = RoundEnd.RECOVERED if kids else RoundEnd.BONUS
            return Verdict(path, x, ended, accept_probs, [0.0] * len(accept_probs))
        path.append(child)
        node = child
