"""THE verification core: pure tensor functions, no model calls (Yin et al. 2024, Alg. 1 and 2).

Vocabulary (as in vLLM's rejection sampler): a drafted token is *accepted* with probability
b = min(1, target/draft); the first rejected position gets a *recovered* token drawn from the
residual [target − b·draft]_+ (normalised); when every drafted token is accepted the target's law
after the last one gives a free *bonus* token. Every engine (chain, batch, tree) calls these
functions; none re-implements acceptance. The NumPy twins in :mod:`specbound.theory` hold the same
formulas for exact expectations and are cross-checked in the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import SpecboundError
from ..theory.tradeoff import OVER_ACCEPTANCE_FORMS

__all__ = ["AcceptanceRule", "ChainVerdict", "acceptance_probability", "residual_distribution", "verify_chain"]


def acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                           tokens: torch.Tensor) -> torch.Tensor:
    """b(x) = min(1, target(x)/draft(x)) at the drafted tokens x (Yin et al. 2024, Alg. 1).

    ``target_probs``/``draft_probs`` are [..., V]; ``tokens`` is [...] and was sampled from
    ``draft_probs``, so draft(x) > 0 and nothing divides by zero.
    """
    t = target_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    d = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(d > 0, (t / d.clamp_min(torch.finfo(d.dtype).tiny)).clamp(max=1.0), torch.ones_like(t))


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                          accept: torch.Tensor | None = None) -> torch.Tensor:
    """[target − b·draft]_+ normalised; b = min(1, target/draft) when ``accept`` is None.

    Same formula as :func:`specbound.theory.residual` (standard SD, the unbiased family of Thm 2,
    and the optimal residual P* of Thm 4). Rows with no positive mass fall back to the target.
    """
    if accept is None:
        excess = (target_probs - draft_probs).clamp_min(0)
    else:
        excess = (target_probs - accept * draft_probs).clamp_min(0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass.clamp_min(torch.finfo(excess.dtype).tiny), target_probs)


class AcceptanceRule:
    """A member of the rejection-based family (Yin et al. 2024, Alg. 2): acceptance b, resampling law.

    The default methods are standard speculative decoding. Subclasses override :meth:`acceptance`
    (full-vocabulary b, [..., V]) and, if needed, :meth:`resample_law`; ``lossless`` says whether the
    output law is the target's (b ≤ min(1, target/draft) with the residual resampling law).
    """

    lossless: bool = True
    name: str = "standard"

    def acceptance(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        ratio = target_probs / draft_probs.clamp_min(torch.finfo(draft_probs.dtype).tiny)
        return torch.where(draft_probs > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))

    def resample_law(self, target_probs, draft_probs, accept) -> torch.Tensor:
        return residual_distribution(target_probs, draft_probs, accept)


STANDARD = AcceptanceRule()


@dataclass
class ChainVerdict:
    """Outcome of verifying one drafted chain per row."""

    accepted: torch.Tensor       # [B] number of drafted tokens accepted (a prefix of the draft)
    next_token: torch.Tensor     # [B] recovered or bonus token; -1 when none (no bonus law given)
    rejected: torch.Tensor       # [B] bool: a drafted token was rejected (next_token is recovered)


def verify_chain(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None = None, rule: AcceptanceRule = STANDARD) -> ChainVerdict:
    """Speculative verification of one chain per row (Leviathan et al. 2023; Yin et al. 2024, Alg. 1).

    draft_tokens [B, k]; draft_probs [B, k, V] (the processed laws they were sampled from);
    target_probs [B, k, V] or [B, k+1, V] (processed target laws before each drafted token and, if
    given, after the last one, for the bonus token). ``rule`` swaps in another member of the
    rejection-based family; the default (standard SD) only evaluates b at the drafted tokens.
    """
    batch, k = draft_tokens.shape
    rows = torch.arange(batch)
    if rule is STANDARD:
        ratio = acceptance_probability(target_probs[:, :k], draft_probs, draft_tokens)
    else:
        accept_all = rule.acceptance(target_probs[:, :k], draft_probs)          # [B, k, V]
        ratio = accept_all.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    uniforms = torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype)
    accepted = (uniforms < ratio).to(torch.long).cumprod(dim=-1).sum(dim=-1)
    rejected = accepted < k
    has_bonus = target_probs.shape[1] > k

    at = accepted.clamp(max=k - 1)
    if rule is STANDARD:
        recovered_law = residual_distribution(target_probs[rows, at], draft_probs[rows, at])
    else:
        recovered_law = rule.resample_law(target_probs[rows, at], draft_probs[rows, at], accept_all[rows, at])
    if has_bonus:
        law = torch.where(rejected.unsqueeze(-1), recovered_law, target_probs[:, k])
        next_token = torch.multinomial(law, 1, generator=generator).squeeze(-1)
    else:
        next_token = torch.full((batch,), -1, dtype=torch.long)
        if rejected.any():
            drawn = torch.multinomial(recovered_law, 1, generator=generator).squeeze(-1)
            next_token = torch.where(rejected, drawn, next_token)
    return ChainVerdict(accepted=accepted, next_token=next_token, rejected=rejected)


# ---------------------------------------------------------------------------------------------------
# draft trees: deterministic trees (Pankratov & Alistarh 2026) and sampled multi-draft trees (SpecInfer)
# ---------------------------------------------------------------------------------------------------


@dataclass
class TreeVerdict:
    """Outcome of verifying one draft tree (batch 1).

    ``path`` lists the accepted nodes (tree indices, root-to-node); ``next_token`` is the recovered
    token (``rejected``: the walk stopped at a node that had children) or the bonus token (the walk
    ended at a leaf), or −1 when the walk ended at a node for which no target law was given.
    """

    path: list[int]
    next_token: int
    rejected: bool

    @property
    def accepted(self) -> int:
        """X: the number of accepted drafted tokens (depth of the deepest accepted node)."""
        return len(self.path)


def _tree_layout(tokens, parents, target_probs: torch.Tensor, law_mask) -> tuple[list[int], list[list[int]], list[bool]]:
    """Validate a tree (tokens [n], parents [n], target_probs [n+1, V], law_mask [n+1]); return
    (tokens, children per node with the root at slot 0 (node i at slot i+1), has-law per slot)."""
    toks = torch.as_tensor(tokens, dtype=torch.long).reshape(-1).tolist()
    pars = [int(p) for p in torch.as_tensor(parents, dtype=torch.long).reshape(-1).tolist()]
    n = len(toks)
    if len(pars) != n:
        raise SpecboundError(f"tree has {n} tokens but {len(pars)} parents")
    if target_probs.ndim != 2 or target_probs.shape[0] != n + 1:
        raise SpecboundError(
            f"target_probs must be [n+1, V] (root law, then the law after each of the n={n} nodes), "
            f"got shape {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[1]
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for i, (tok, par) in enumerate(zip(toks, pars)):
        if not -1 <= par < i:
            raise SpecboundError(f"tree node {i} has parent {par}: parents must precede children (−1 = root)")
        if not 0 <= tok < vocab:
            raise SpecboundError(f"tree node {i} has token {tok} outside [0, {vocab})")
        children[par + 1].append(i)
    if law_mask is None:
        has_law = [True] * (n + 1)
    else:
        has_law = [bool(x) for x in torch.as_tensor(law_mask, dtype=torch.bool).reshape(-1).tolist()]
        if len(has_law) != n + 1:
            raise SpecboundError(f"law_mask must have n+1 = {n + 1} entries, got {len(has_law)}")
    return toks, children, has_law


def verify_tree_deterministic(tokens, parents, target_probs: torch.Tensor, generator: torch.Generator | None = None,
                              law_mask=None) -> TreeVerdict:
    """Lossless verification of a *deterministic* draft tree (Pankratov & Alistarh 2026, §1 step 3).

    The tree must be a deterministic function of what the drafter knows (no private randomness),
    e.g. a best-first tree of the draft's path probabilities or the oracle tree T*(P). Walk from the
    root: at the current node sample x from the target's processed law; if the node has a child with
    token x, accept it and move there, else stop — x is the final token (recovered if the node had
    children, bonus if it is a leaf). Every emitted token is drawn from the target's law given its
    prefix, so the output law is the target's exactly, and X = max{k : x_1..x_k ∈ T} has mean
    E[X | T] = Σ_{v∈T} p_target(v) (the tree value of §2).

    ``tokens`` [n] and ``parents`` [n] (−1 = child of the root, parents precede children) describe the
    tree; sibling tokens must be distinct. ``target_probs`` [n+1, V]: row 0 is the target law at the
    root (after the last committed token), row i+1 the law after node i. ``law_mask`` [n+1] (bool,
    optional) marks rows that hold a law; a walk reaching a node without one stops with
    ``next_token = −1`` (used at the end of a generation budget, where no further token is wanted).
    """
    toks, children, has_law = _tree_layout(tokens, parents, target_probs, law_mask)
    lookup: list[dict[int, int]] = []
    for slot, kids in enumerate(children):
        table: dict[int, int] = {}
        for c in kids:
            if toks[c] in table:
                raise SpecboundError(
                    f"node {slot - 1} has two children with token {toks[c]}: a deterministic draft tree "
                    "needs distinct sibling tokens"
                )
            table[toks[c]] = c
        lookup.append(table)
    node, path = -1, []
    while True:
        if not has_law[node + 1]:
            return TreeVerdict(path, -1, False)
        x = int(torch.multinomial(target_probs[node + 1], 1, generator=generator))
        child = lookup[node + 1].get(x)
        if child is None:
            return TreeVerdict(path, x, bool(children[node + 1]))
        path.append(child)
        node = child


def verify_tree_multidraft(tokens, parents, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                           generator: torch.Generator | None = None, law_mask=None) -> TreeVerdict:
    """Lossless verification of a *sampled* draft tree by recursive rejection sampling.

    Multi-step speculative sampling (SpecInfer, Miao et al. 2024; Chen et al. 2023's rejection
    sampling applied child by child): the children of a node u were drawn i.i.d. from the draft's
    processed law draft_u (duplicates allowed). Starting from residual r = target_u, each child x in
    turn is accepted with probability min(1, r(x)/draft_u(x)) (:func:`acceptance_probability`); on
    acceptance the walk moves to that child, on rejection r ← [r − draft_u]_+ normalised
    (:func:`residual_distribution`, the standard residual of Yin et al. 2024, Alg. 1, with r in the
    target's place) — exactly :func:`recursive_rejection_sampling` (Yin et al. 2024, Alg. 4) over the
    siblings, which this function calls at every node. If every child is rejected the recovered token is drawn from the final r; at a
    leaf the bonus token is drawn from the target's law. By induction over the children the emitted
    token has law target_u, so the output law is the target's at every node. With one child per node
    this is standard chain speculative decoding.

    ``draft_probs`` [n+1, V]: row 0 is the draft law the root's children were sampled from, row i+1
    the one node i's children were sampled from (rows of leaves are ignored). Other arguments as in
    :func:`verify_tree_deterministic`; a node with children must have a target law.
    """
    toks, children, has_law = _tree_layout(tokens, parents, target_probs, law_mask)
    if draft_probs.shape != target_probs.shape:
        raise SpecboundError(
            f"draft_probs must have the shape of target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}"
        )
    draft_probs = draft_probs.to(target_probs.dtype)
    for slot, kids in enumerate(children):
        if kids and not has_law[slot]:
            raise SpecboundError(f"node {slot - 1} has children but no target law (law_mask is False)")
        for c in kids:
            if not draft_probs[slot, toks[c]] > 0:
                raise SpecboundError(
                    f"child {c} (token {toks[c]}) has draft probability 0 at its parent: children must be "
                    "sampled from draft_probs"
                )
    node, path = -1, []
    while True:
        slot, kids = node + 1, children[node + 1]
        if not kids:
            if not has_law[slot]:
                return TreeVerdict(path, -1, False)
            return TreeVerdict(path, int(torch.multinomial(target_probs[slot], 1, generator=generator)), False)
        # the siblings are i.i.d. draft candidates at one position: the shared recursive rejection step
        verdict = recursive_rejection_sampling(torch.tensor([[toks[c] for c in kids]]), draft_probs[slot:slot + 1],
                                               target_probs[slot:slot + 1], generator)
        won = int(verdict.accepted[0])
        if won < 0:
            return TreeVerdict(path, int(torch.multinomial(verdict.residual[0], 1, generator=generator)), True)
        node = kids[won]
        path.append(node)


__all__ += ["TreeVerdict", "verify_tree_deterministic", "verify_tree_multidraft"]


# ---------------------------------------------------------------------------------------------------
# batch speculative decoding: recursive rejection over i.i.d. candidates (Yin et al. 2024, Alg. 4)
# relaxed / biased decoding: Decoding-OPT and Decoding-UNO (Yin et al. 2024, §5, Thm 4/5)
# ---------------------------------------------------------------------------------------------------


@dataclass
class CandidatesVerdict:
    """Outcome of recursive rejection sampling over the candidates at one position, per row."""

    accepted: torch.Tensor       # [B] index of the accepted candidate, −1 when every candidate was rejected
    residual: torch.Tensor       # [B, V] residual law after the rejected candidates; the recovered token's
                                 # law when accepted == −1 (the target law when nothing was rejected)


def recursive_rejection_sampling(candidates: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                                 generator: torch.Generator | None = None,
                                 alive: torch.Tensor | None = None) -> CandidatesVerdict:
    """Recursive rejection sampling over M i.i.d. draft candidates at one position (Yin et al. 2024, Alg. 4, Thm 3).

    ``candidates`` [B, M] were sampled i.i.d. from ``draft_probs`` [B, V] (the processed draft law at
    this position); ``target_probs`` [B, V] is the processed target law there. Starting from the
    residual r = target, candidate m (in index order) is accepted with probability
    min(1, r(x_m)/draft(x_m)) (:func:`acceptance_probability` with r in the target's place); on
    rejection r ← [r − draft]_+ normalised (:func:`residual_distribution`). The first accepted
    candidate wins; if all are rejected the caller draws the recovered token from the returned
    residual r^M. The emitted token then has the target's law exactly, and all M are rejected with
    probability ρ_M = Π_k TV(draft, r^k) (Thm 3; NumPy twin :func:`specbound.theory.residual_chain`).

    ``alive`` [B, M] (bool, optional) restricts the test to some candidates (design A's prefix-tree
    walk: only candidates that agree with the accepted prefix, which are i.i.d. draft samples given it).
    One uniform is drawn per candidate slot and row, whether or not the slot is tested.
    """
    if candidates.ndim != 2 or draft_probs.ndim != 2 or target_probs.shape != draft_probs.shape \
            or candidates.shape[0] != draft_probs.shape[0]:
        raise SpecboundError(
            f"recursive_rejection_sampling needs candidates [B, M] and draft/target laws [B, V]; got "
            f"{tuple(candidates.shape)}, {tuple(draft_probs.shape)}, {tuple(target_probs.shape)}"
        )
    batch, m = candidates.shape
    if alive is not None and tuple(alive.shape) != (batch, m):
        raise SpecboundError(f"alive must be [B, M] = {(batch, m)}, got {tuple(alive.shape)}")
    draft_probs = draft_probs.to(target_probs.dtype)
    residual = target_probs
    accepted = torch.full((batch,), -1, dtype=torch.long)
    for j in range(m):
        testing = accepted < 0
        if alive is not None:
            testing = testing & alive[:, j]
        uniforms = torch.rand((batch,), generator=generator, dtype=residual.dtype)
        if not bool(testing.any()):
            continue
        ratio = acceptance_probability(residual, draft_probs, candidates[:, j])
        ok = testing & (uniforms < ratio)
        accepted = torch.where(ok, torch.full_like(accepted, j), accepted)
        rejected = testing & ~ok
        if bool(rejected.any()):
            residual = torch.where(rejected.unsqueeze(-1), residual_distribution(residual, draft_probs), residual)
    return CandidatesVerdict(accepted=accepted, residual=residual)


def over_acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor, eps: float,
                                form: str = "additive") -> torch.Tensor:
    """Full-vocabulary over-acceptance b ≥ min(1, target/draft) (Yin et al. 2024, §5; Thm 5).

    ``form="additive"`` (default): b = min(1, (target + ε)/draft); ``form="ratio"``: b = min(1,
    target/draft + ε) (yin2024.md §6 open point 2). b = 1 where the draft has no mass (such a token
    is never drafted). ε = 0 is standard SD. The single torch home of this formula; its NumPy twin
    :func:`specbound.theory.tradeoff.over_acceptance` is cross-checked in the tests.
    """
    if form not in OVER_ACCEPTANCE_FORMS:
        raise SpecboundError(f"over-acceptance form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
    safe = draft_probs.clamp_min(torch.finfo(draft_probs.dtype).tiny)
    ratio = (target_probs + eps) / safe if form == "additive" else target_probs / safe + eps
    return torch.where(draft_probs > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))


def step_output_bias(target_probs: torch.Tensor, draft_probs: torch.Tensor, accept: torch.Tensor,
                     resample: torch.Tensor) -> torch.Tensor:
    """Loss_TV(b, P) = TV(draft·b + (1 − β)·P, target), β = Σ draft·b: the bias of one rejection step.

    Yin et al. 2024, Thm 4. The output law of a step that accepts a drafted token with probability b
    and otherwise draws from P is draft·b + (1 − β)·P; for P = P* (Decoding-OPT) this TV equals
    Σ[b·draft − target]_+, for P = target (Decoding-UNO) ½Σ|draft·b − β·target|. Over [..., V].
    """
    beta = (draft_probs * accept).sum(dim=-1, keepdim=True)
    law = draft_probs * accept + (1.0 - beta) * resample
    return 0.5 * (law - target_probs).abs().sum(dim=-1)


class RelaxedAcceptance(AcceptanceRule):
    """Over-accepting (biased) member of the rejection-based family (Yin et al. 2024, §5, Thm 4/5).

    b = :func:`over_acceptance_probability` (ε, ``form``); subclasses choose the resampling law.
    Fewer rejections than standard SD (1 − Σ draft·b), at a TV bias per step of
    :meth:`step_bias`; for Decoding-OPT the two add up to TV(draft, target) (Thm 5).
    """

    lossless = False
    name = "relaxed"

    def __init__(self, eps: float, form: str = "additive"):
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise SpecboundError(f"eps (over-acceptance threshold) must be a finite number >= 0, got {eps!r}")
        if form not in OVER_ACCEPTANCE_FORMS:
            raise SpecboundError(f"over-acceptance form must be one of {OVER_ACCEPTANCE_FORMS}, got {form!r}")
        self.eps, self.form = float(eps), form

    def acceptance(self, target_probs, draft_probs) -> torch.Tensor:
        return over_acceptance_probability(target_probs, draft_probs, self.eps, self.form)

    def step_bias(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        """Exact TV bias of this rule's one-step output law at each row [...] (Yin et al. 2024, Thm 4)."""
        accept = self.acceptance(target_probs, draft_probs)
        return step_output_bias(target_probs, draft_probs, accept, self.resample_law(target_probs, draft_probs, accept))

    def describe(self) -> str:
        return f"{self.name}(eps={self.eps:g}, {self.form})"


class DecodingOPT(RelaxedAcceptance):
    """Decoding-OPT: over-acceptance b, resampling from the optimal P* = [target − b·draft]_+ normalised
    (Yin et al. 2024, Thm 4: the least TV bias Σ[b·draft − target]_+ for this b). P* is exactly
    :func:`residual_distribution` with ``accept = b`` (the inherited :meth:`resample_law`)."""

    name = "opt"


class DecodingUNO(RelaxedAcceptance):
    """Decoding-UNO: the same over-acceptance b as OPT (same rejection rate), resampling from the
    target itself (Yin et al. 2024, §5): bias ½Σ|draft·b − β·target| ≥ OPT's."""

    name = "uno"

    def resample_law(self, target_probs, draft_probs, accept) -> torch.Tensor:
        return target_probs


RELAXATIONS = {"opt": DecodingOPT, "uno": DecodingUNO}


__all__ += ["CandidatesVerdict", "DecodingOPT", "DecodingUNO", "RELAXATIONS", "RelaxedAcceptance",
            "over_acceptance_probability", "recursive_rejection_sampling", "step_output_bias"]
