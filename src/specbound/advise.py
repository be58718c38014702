"""`specbound advise`: how much speculation can give THIS pair on THIS engine and machine, and which
settings get closest — predicted from measurements, then checked against measured runs.

Measured here, through the engine (formulas from :mod:`specbound.theory`): the cost curves t(k) of the
target and d(k) of the draft; the acceptance of chains (at greedy along the target's own greedy texts,
renewal-reward; at T = 1 per position; and under block verification), of dynamic trees, and at T > 0 of
sampled trees and M-draft batches scored exactly given what they drafted; the optimal tree value
E[X | T*(P)] and the bound from the target's entropy moments μ, μ₂. Combined by
:func:`specbound.theory.round_speedup`: speed-up = (1 + E[X]) · t(1) / (draft seconds + t(tokens
verified)). The recommendation is the best predicted setting, or plainly "speculation will not pay
here"; :func:`measure_settings` then runs several settings on held-out prompts and reports measured /
predicted. Each ingredient in full: docs/notes.md (`advise.py`).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .decoding import SamplingConfig, autoregressive_decode, speculative_decode
from .decoding.batch import rows_shared
from .decoding.costs import CostMeasurement, measure_costs
from .errors import SpecboundError
from .measure.batch_passes import BatchPassCosts, measure_batch_passes
from .measure.drafter_values import (
    SampledShape, chain_verification_values, dynamic_tree_values, greedy_tree_rounds, sampled_shape_values,
)
from .measure.moments import measure_moments
from .measure.oracle import choose_positions, contexts_at, oracle_values
from .seeds import derive_seed
from .theory.bounds import MomentEstimate
from .theory.speedup import (
    CostProfile, chain_draft_seconds, chain_full_acceptance, expected_tokens_per_step, greedy_chain_full_rounds,
    greedy_chain_rounds, perfect_draft_throughput, round_speedup, rows_pass_seconds, shared_pass_throughput,
)

__all__ = ["AdviseConfig", "Advice", "BatchAdvice", "ModeAdvice", "Setting", "advise", "batch_advice", "batch_table",
           "measure_batches", "measure_settings", "recommendation"]

MODES = {"greedy": SamplingConfig(0.0), "sampled": SamplingConfig(1.0)}
CAPACITIES = (1, 2, 4, 8, 16, 32, 64)
GAMMAS = tuple(range(1, 17))
#: T > 0: shapes verified by recursive rejection that advise prices (specbound's engine only)
SAMPLED_SHAPES = tuple(SampledShape("sampled", P) for P in (4, 8, 16, 32)) + \
    tuple(SampledShape("drafts", M, g) for M in (2, 4) for g in (2, 4, 6))
PAYS = 1.05      # below this predicted speed-up, speculation is not worth its complexity


@dataclass
class AdviseConfig:
    engine: str = "torch"
    prompt_set: str = "humaneval"
    offset: int = 20               # calibration prompts (measured settings use the next ones)
    n_prompts: int = 4
    tokens: int = 48               # generated tokens per calibration prompt
    positions: int = 24            # positions for exact tree values and the oracle
    chain_gamma: int = 12          # chain length of the acceptance run
    repeats: int = 3               # cost-curve repeats
    modes: tuple[str, ...] = ("greedy", "sampled")
    seed: int = 0
    batches: tuple[int, ...] = ()  # batch sizes B to predict (and check) batched decoding for
    # the prompt length (tokens) the batch sizes are priced at: the calibration prompts are cut or extended
    # to it for the batched passes (measure_batch_passes); None: as they are
    batch_context: int | None = None


@dataclass
class Setting:
    """One predicted (and possibly measured) setting: a chain of γ (verified token-wise, or jointly:
    "block"), a dynamic tree of capacity P, a sampled tree of capacity P ("sampled") or M draft
    sequences of ``gamma`` tokens ("drafts", size = M), the last two verified by recursive rejection."""

    kind: str                      # "chain" | "block" | "tree" | "sampled" | "drafts"
    size: int
    expected_tokens: float         # 1 + E[X] per round
    draft_seconds: float
    verified_tokens: int
    predicted: float               # predicted speed-up over plain decoding
    measured: float | None = None
    gamma: int | None = None       # "drafts": tokens per draft sequence

    @property
    def label(self) -> str:
        return {"chain": f"chain γ={self.size}", "block": f"chain (block verification) γ={self.size}",
                "tree": f"tree P={self.size}", "sampled": f"sampled tree P={self.size}",
                "drafts": f"{self.size} drafts × γ={self.gamma}"}[self.kind]

    def decode_kwargs(self) -> dict:
        """The keywords of :func:`specbound.decoding.speculative_decode` that run this setting."""
        return {"chain": {"gamma": self.size}, "block": {"gamma": self.size, "verification": "block"},
                "tree": {"tree": self.size}, "sampled": {"tree": self.size, "tree_drafter": "sampled"},
                "drafts": {"drafts": self.size, "gamma": self.gamma}}[self.kind]

    def command(self) -> str:
        """The ``specbound generate`` options that run this setting."""
        return {"chain": f"--gamma {self.size}", "block": f"--gamma {self.size} --verification block",
                "tree": f"--tree {self.size}", "sampled": f"--tree {self.size} --tree-drafter sampled",
                "drafts": f"--drafts {self.size} --gamma {self.gamma}"}[self.kind]


@dataclass
class BatchAdvice:
    """Batch size B: plain batched decoding, the best chain γ for B and the speed of light, in total
    tokens per second (predicted from the costs and the acceptance; measured when checked)."""

    batch: int
    plain: float                   # B / t(B)
    gamma: int                     # best chain length at B (0: decode plainly)
    speculative: float             # predicted total tok/s of chains of γ
    speed_of_light: float          # T*(P) drafted for free, best P
    speed_of_light_capacity: int
    measured_plain: float | None = None
    measured_speculative: float | None = None
    passes: BatchPassCosts | None = None     # what B rows measured on calibration prompts (None: not priced so)
    measured_plain_range: tuple[float, float] | None = None        # slowest, fastest checked batch
    measured_speculative_range: tuple[float, float] | None = None
    measured_batches: int = 0                # batches (× runs) the medians are over
    perfect_draft: float | None = None       # total tok/s if every drafted token were accepted (this draft's cost)
    perfect_draft_gamma: int = 0             # its chain length (0: even a perfect draft of this cost loses)

    @property
    def speedup(self) -> float:
        return self.speculative / self.plain


@dataclass
class ModeAdvice:
    mode: str
    acceptance: list[float]                        # α_i, chain positions
    chain: dict[int, Setting]
    tree: dict[int, Setting]
    oracle: dict[int, float] = field(default_factory=dict)          # E[X | T*(P)]
    bound: dict[int, float] = field(default_factory=dict)           # renewal bound on E[X](P)
    speed_of_light: dict[int, float] = field(default_factory=dict)  # speed-up of T*(P), free drafting
    bound_speedup: dict[int, float] = field(default_factory=dict)
    best: Setting | None = None
    batch: dict[int, BatchAdvice] = field(default_factory=dict)
    # T > 0: chains under block verification (Sun et al. 2025): 1 + E[X] of the same sampled chains at the
    # oracle's positions, exact under token-wise (block_token) and block verification (block_positions);
    # their ratio is the verifier's gain alone, and a block setting's tokens per round are the chain's
    # (from its own runs, as the chain is priced) times that gain
    block: dict[int, Setting] = field(default_factory=dict)
    block_token: dict[int, float] = field(default_factory=dict)
    block_positions: dict[int, float] = field(default_factory=dict)
    # T > 0: sampled trees and M-draft batches (recursive rejection), exact at the same positions
    shapes: list[Setting] = field(default_factory=list)
    context: "ContextAdvice | None" = None         # the context drafter (no draft model) on the same prompts

    @property
    def best_block(self) -> Setting | None:
        return max(self.block.values(), key=lambda s: s.predicted) if self.block else None

    @property
    def best_shape(self) -> Setting | None:
        return max(self.shapes, key=lambda s: s.predicted) if self.shapes else None

    @property
    def engine_settings(self) -> list[Setting]:
        """Everything specbound's engine runs: chains, dynamic trees, block-verified chains, sampled trees
        and M drafts."""
        return list(self.chain.values()) + list(self.tree.values()) + list(self.block.values()) + self.shapes

    @property
    def best_engine(self) -> Setting | None:
        """The best predicted setting of everything specbound's engine runs (:attr:`engine_settings`):
        what ``specbound generate`` should be given."""
        pool = self.engine_settings
        return max(pool, key=lambda s: s.predicted) if pool else None

    @property
    def best_measured(self) -> Setting | None:
        """The checked setting that measured fastest on the held-out prompts (None before the checks)."""
        checked = [s for s in self.engine_settings if s.measured is not None]
        return max(checked, key=lambda s: s.measured) if checked else None

    @property
    def pays(self) -> bool:
        return self.best is not None and self.best.predicted >= PAYS


@dataclass
class Advice:
    config: AdviseConfig
    models: dict
    costs: dict                     # ks, target_ms, target_spread, draft_ms, draft_spread
    moments: MomentEstimate         # the target's μ, μ₂ at T = 1 on its own samples (with standard errors)
    modes: dict[str, ModeAdvice]
    seconds: float = 0.0
    measured_prompts: list[str] = field(default_factory=list)
    measured_streams: int = 1       # runs per held-out prompt in the checks (T > 0: paired random streams)

    def cost_profiles(self) -> tuple[CostProfile, CostProfile]:
        ks = tuple(self.costs["ks"])
        return (CostProfile(ks, tuple(s / 1e3 for s in self.costs["target_ms"])),
                CostProfile(ks, tuple(s / 1e3 for s in self.costs["draft_ms"])))


@dataclass
class ContextAdvice:
    """The context drafter (``generate --draft none``) on the calibration prompts, run through the engine:
    the share of rounds it found something to draft, the acceptance of its drafted tokens, τ; ``measured``
    (after the checks): its speed-up over plain decoding on the held-out prompts. It pays where that is
    at least :data:`PAYS`; mixed into the model draft's chain (``context="auto"``) it costs no draft read."""

    drafted_rounds: float
    acceptance: float
    tau: float
    measured: float | None = None

    @property
    def pays(self) -> bool | None:
        return None if self.measured is None else self.measured >= PAYS


def context_advice(target, prompts, tokens: int, sampling: SamplingConfig, seed: int) -> ContextAdvice:
    """Decode the prompts with the context alone and pool what its rounds did."""
    rounds = drafted_rounds = drafted = accepted = new = calls = 0
    for k, ids in enumerate(prompts):
        m = speculative_decode(target, None, ids, tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                               top_p=sampling.top_p, seed=derive_seed(seed, "advise context", k)).metrics
        rounds += len(m.drafted_per_step)
        drafted_rounds += sum(1 for d in m.drafted_per_step if d)
        drafted, accepted = drafted + m.context_drafted, accepted + m.context_accepted
        new, calls = new + m.new_tokens, calls + m.target_calls
    return ContextAdvice(drafted_rounds=drafted_rounds / max(rounds, 1), acceptance=accepted / max(drafted, 1),
                         tau=new / max(calls, 1))


# ----------------------------------------------------------------------------------------------- measure
@dataclass
class AcceptanceRun:
    """What the fixed-γ chain runs on the calibration prompts give: per-position acceptance α_i, the
    target's texts (its own greedy text at T = 0) and the draft's seconds per forward inside a chain."""

    alpha: list[float]
    texts: list[tuple[list[int], list[int]]]       # (prompt, generated tokens)
    draft_seconds_per_call: float                  # one-token reads (the two-token reads after whole chains taken out)


def _acceptance_run(target, draft, prompts, tokens, gamma, sampling, seed, catch_up: float = 0.0) -> AcceptanceRun:
    """α_i = P(position i accepted | positions < i accepted), pooled over prompts, fixed γ; prompt k
    decodes with ``derive_seed(seed, "advise acceptance", k)`` (the same for every mode). The draft's
    seconds per forward leave out ``catch_up`` (d(2) − d(1)) per round that accepted all γ tokens: the
    next round's first read took two tokens (``theory.speedup.chain_draft_seconds`` adds it back per γ)."""
    reached, accepted = np.zeros(gamma), np.zeros(gamma)
    texts, draft_seconds, draft_calls = [], 0.0, 0
    for k, ids in enumerate(prompts):
        res = speculative_decode(target, draft, ids, tokens, gamma=gamma, temperature=sampling.temperature,
                                 top_k=sampling.top_k, top_p=sampling.top_p,
                                 seed=derive_seed(seed, "advise acceptance", k))
        m = res.metrics
        texts.append((list(ids), list(res.tokens)))
        whole = sum(1 for a in m.accepted_per_step[:-1] if a == gamma)     # the last round has no next read
        draft_seconds, draft_calls = draft_seconds + m.draft_time - whole * catch_up, draft_calls + m.draft_calls
        n = min(gamma, len(m.position_reached))
        reached[:n] += m.position_reached[:n]
        accepted[:n] += m.position_accepted[:n]
    alpha = np.where(reached > 0, accepted / np.maximum(reached, 1), np.nan)
    last = 0.0
    out = []
    for a in alpha:                                      # unseen deep positions reuse the last seen rate
        last = last if math.isnan(a) else float(a)
        out.append(last)
    return AcceptanceRun(out, texts, max(draft_seconds, 0.0) / max(draft_calls, 1))


def _greedy_matches(draft, texts) -> list[np.ndarray]:
    """Per text: does the draft's arg-max equal the target's greedy token, position by position?
    One teacher-forced draft read per text (the draft sees exactly the prefixes a greedy chain
    would: every accepted token is the target's)."""
    import torch

    out = []
    for prompt, tokens in texts:
        if not tokens:
            continue
        draft.reset()
        logits = draft.forward(torch.tensor([prompt + tokens[:-1]]))[0, len(prompt) - 1:]
        out.append((logits.argmax(-1) == torch.tensor(tokens)).numpy())
    draft.reset()
    return out


def _tree_draft_seconds(reads: np.ndarray, draft_cost: CostProfile) -> float:
    """Σ_k reads[k] · d(k): the draft calls the dynamic-tree drafter of this capacity makes per round
    (the root re-read, then one call per depth over the nodes of that depth among its P best), each
    priced by the draft's cost curve."""
    return sum(float(n) * float(draft_cost(k)) for k, n in enumerate(reads) if k > 0 and n > 0)


def advise(target, draft, prompt_ids: list[list[int]], config: AdviseConfig, progress=None) -> Advice:
    """Measure everything and predict every setting (see the module docstring)."""
    t0 = time.perf_counter()
    costs: CostMeasurement = measure_costs(target, draft, repeats=config.repeats)
    verify_cost, draft_cost = costs.target, costs.draft
    moments = measure_moments(target, prompt_ids, config.tokens, 1.0, seed=config.seed, progress=progress)
    positions = choose_positions(moments.samples, config.positions)
    contexts = contexts_at(moments.samples, positions)
    estimate = moments.estimate
    sharing = rows_shared(target, draft)
    batch_passes = {}
    if config.batches:                      # what B rows cost here, on the calibration prompts (greedy)
        batch_passes = measure_batch_passes(target, draft, prompt_ids, config.batches, costs, sharing,
                                            tokens=max(config.tokens, 2), context=config.batch_context,
                                            progress=progress)
    modes = {}
    for mode in config.modes:
        sampling = MODES[mode]
        catch_up = max(float(draft_cost(2)) - float(draft_cost(1)), 0.0)      # a two-token read's extra
        run = _acceptance_run(target, draft, prompt_ids, config.tokens, config.chain_gamma, sampling, config.seed,
                              catch_up)
        alpha = run.alpha
        matches = _greedy_matches(draft, run.texts) if sampling.greedy else None
        chain = {}
        for g in GAMMAS:
            if matches:          # exact along the target's greedy texts, rounds where they really start
                rounds = [greedy_chain_rounds(m, g) for m in matches]
                tau = sum(n for _, n in rounds) / max(sum(r for r, _ in rounds), 1)
                full = sum(greedy_chain_full_rounds(m, g) for m in matches) / max(sum(r for r, _ in rounds), 1)
            else:
                tau = expected_tokens_per_step(alpha, g)
                full = chain_full_acceptance(alpha, g)
            # a draft forward as it costs inside a running chain, and the two-token read after a whole chain
            seconds = chain_draft_seconds(g, run.draft_seconds_per_call, catch_up, full)
            chain[g] = Setting(kind="chain", size=g, expected_tokens=tau, draft_seconds=seconds, verified_tokens=g + 1,
                               predicted=float(round_speedup(tau - 1.0, seconds, verify_cost, g + 1)))
        if sampling.greedy:      # rounds along the target's own greedy texts, where they really start
            trees = greedy_tree_rounds(draft, run.texts, CAPACITIES, sampling)
        else:                    # exact values at the oracle's positions of the target's samples
            trees = dynamic_tree_values(target, draft, contexts, CAPACITIES, sampling,
                                        derive_seed(config.seed, "advise tree values", mode))
        tree = {}
        for j, P in enumerate(CAPACITIES):       # its reads, and the two-token read after a path to a leaf
            seconds = _tree_draft_seconds(trees.reads[j], draft_cost) + float(trees.whole[j]) * catch_up
            value = float(trees.values[j])
            tree[P] = Setting(kind="tree", size=P, expected_tokens=1.0 + value, draft_seconds=seconds,
                              verified_tokens=P + 1, predicted=float(round_speedup(value, seconds, verify_cost, P + 1)))
        advice = ModeAdvice(mode, alpha, chain, tree)
        advice.context = context_advice(target, prompt_ids, config.tokens, sampling, config.seed)
        if not sampling.greedy:  # at greedy block verification is token-wise verification
            values = chain_verification_values(target, draft, contexts, GAMMAS, sampling,
                                               derive_seed(config.seed, "advise block", mode))
            for j, g in enumerate(values.gammas):
                # price the block-verified chain on the chain's own footing: its tokens per round times the
                # verifier's exact gain on the same sampled chains (two estimators of the chain's value — its
                # runs' acceptance and the positions' exact values — differ by more than that gain, so
                # comparing a block value of one with a token-wise value of the other ranks noise)
                token_tokens, block_tokens = 1.0 + float(values.token[j]), 1.0 + float(values.block[j])
                tau = chain[g].expected_tokens * (block_tokens / token_tokens)
                seconds = chain[g].draft_seconds
                advice.block[g] = Setting(kind="block", size=g, expected_tokens=tau, draft_seconds=seconds,
                                          verified_tokens=g + 1,
                                          predicted=float(round_speedup(tau - 1.0, seconds, verify_cost, g + 1)))
                advice.block_token[g], advice.block_positions[g] = token_tokens, block_tokens
            shaped = sampled_shape_values(target, draft, contexts, SAMPLED_SHAPES, sampling,
                                          derive_seed(config.seed, "advise sampled shapes", mode))
            for j, shape in enumerate(shaped.shapes):
                seconds = _tree_draft_seconds(shaped.reads[j], draft_cost)
                verified = max(1, int(round(shaped.nodes[j]))) + 1
                value = float(shaped.values[j])
                advice.shapes.append(Setting(kind=shape.kind, size=shape.size, gamma=shape.gamma,
                                             expected_tokens=1.0 + value, draft_seconds=seconds,
                                             verified_tokens=verified,
                                             predicted=float(round_speedup(value, seconds, verify_cost, verified))))
        if mode == "greedy":      # a greedy target is a point mass: the optimal tree is its arg-max chain
            advice.oracle = {P: float(P) for P in CAPACITIES}
        else:
            oracle = oracle_values(target, moments.samples, CAPACITIES, len(positions), temperature=1.0,
                                   progress=progress)
            advice.oracle = {P: float(v) for P, v in zip(CAPACITIES, oracle.mean)}
            advice.bound = {P: float(estimate.bound(P, form="renewal")) for P in CAPACITIES}
            advice.bound_speedup = {P: float(round_speedup(b, 0.0, verify_cost, P + 1)) for P, b in advice.bound.items()}
        advice.speed_of_light = {P: float(round_speedup(v, 0.0, verify_cost, P + 1)) for P, v in advice.oracle.items()}
        advice.best = max(list(chain.values()) + list(tree.values()), key=lambda s: s.predicted)
        advice.batch = {B: batch_advice(B, chain, advice.oracle, verify_cost, draft_cost, sharing, batch_passes.get(B))
                        for B in config.batches}
        modes[mode] = advice
    return Advice(config=config,
                  models={"target": f"{target.name} ({target.info.kernels})",
                          "draft": f"{draft.name} ({draft.info.kernels})"},
                  costs={"ks": list(verify_cost.ks), "target_ms": [1e3 * s for s in verify_cost.seconds],
                         "target_spread": costs.target_spread, "draft_ms": [1e3 * s for s in draft_cost.seconds],
                         "draft_spread": costs.draft_spread},
                  moments=estimate, modes=modes, seconds=time.perf_counter() - t0)


#: The deepest chain the perfect-draft bound tries (its rate levels off: B / (d_B + B · slope of t)).
PERFECT_DRAFT_MAX_GAMMA = 32


def batch_advice(batch: int, chain: dict[int, Setting], oracle: dict[int, float], verify_cost: CostProfile,
                 draft_cost: CostProfile, rows_shared: tuple[bool, bool] = (True, True),
                 passes: BatchPassCosts | None = None) -> BatchAdvice:
    """Predictions for B requests decoded together (theory/speedup.py, ``shared_pass_throughput``):
    plain B / t(B); a chain of γ yields its measured E[tokens per round] per request for γ draft
    passes over the B rows (each priced d_B/d(1) times the draft forward measured inside a chain: d_B =
    d(B) where the draft's rows share a pass, B·d(1) where they run in turn, ``rows_shared[0]``) and one
    target pass over B(γ + 1) tokens; the speed of light drafts T*(P) for free, max over P of
    B(1 + E[X*])/t(B(P + 1)). With ``passes`` (:func:`~specbound.measure.batch_passes.measure_batch_passes`
    at this B) the batch is priced as it measured: target passes scaled by their measured/predicted ratio,
    plus per round the draft's passes and the work outside the passes on the line through the two
    calibrated chain lengths (``BatchPassCosts.draft_seconds`` / ``work``; w_plain for a plain round and
    for the speed of light). The perfect draft (``theory.speedup.perfect_draft_throughput``) prices this
    draft's passes as the chains are priced, with every drafted token accepted and w_plain per round: no
    drafter of this cost exceeds it at this B, whatever its acceptance."""
    if not rows_shared[1]:
        raise SpecboundError("advise --batch prices a target whose rows share one pass (a torch target with the "
                             "static cache); this target's rows run in turn")
    scale_t = passes.target_ratio if passes is not None else 1.0
    w_plain = passes.plain_work if passes is not None else 0.0
    plain = float(shared_pass_throughput(1.0, batch, 0.0, 1, verify_cost, scale_t, w_plain))
    if passes is not None:
        rates = {g: float(shared_pass_throughput(s.expected_tokens, batch, passes.draft_seconds(g), g + 1, verify_cost,
                                                 scale_t, passes.work(g)))
                 for g, s in chain.items()}
    else:
        scale = float(rows_pass_seconds(draft_cost, batch, 1, rows_shared[0])) / float(draft_cost(1))
        rates = {g: float(shared_pass_throughput(s.expected_tokens, batch, s.draft_seconds * scale, g + 1, verify_cost))
                 for g, s in chain.items()}
    gamma = max(rates, key=rates.get) if rates else 0
    if not rates or rates[gamma] <= plain:
        gamma, best = 0, plain
    else:
        best = rates[gamma]
    light = {P: float(shared_pass_throughput(1.0 + v, batch, 0.0, P + 1, verify_cost, scale_t, w_plain))
             for P, v in oracle.items()}
    P = max(light, key=light.get) if light else 0
    depths = range(1, PERFECT_DRAFT_MAX_GAMMA + 1)
    if passes is not None:
        draft_rounds = [passes.draft_seconds(g) for g in depths]
    else:
        draft_rounds = [g * float(rows_pass_seconds(draft_cost, batch, 1, rows_shared[0])) for g in depths]
    perfect_gamma, perfect = perfect_draft_throughput(batch, draft_rounds, verify_cost, scale_t, w_plain)
    return BatchAdvice(batch=batch, plain=plain, gamma=gamma, speculative=best,
                       speed_of_light=max(light[P], plain) if light else plain, speed_of_light_capacity=P,
                       passes=passes, perfect_draft=perfect, perfect_draft_gamma=perfect_gamma)


# ----------------------------------------------------------------------------------------------- check
def measure_batches(target, draft, advice: Advice, prompt_ids: list[list[int]], tokens: int, runs: int = 1) -> None:
    """Run plain batched decoding and the advised chain at every batch size on the held-out prompts and
    fill the measured total tokens per second after the prefill (the target's prompt reads, the same work
    with or without speculation; the draft's prompt read is in the decoding time, which the per-round
    prediction leaves out): the MEDIAN over batches, and the range. Every
    prompt is decoded at every B: ⌈n/B⌉ batches of B requests (the prompts taken in turn, cycled to fill
    the last), each ``runs`` times, plain and speculative paired on each. (One batch per B, as this was,
    priced B = 1 on one prompt: 1.09× for γ = 4 where the single-request checks' median over two prompts
    was 1.68×, and no B could be checked within 15%.)"""
    from .decoding.batch import autoregressive_decode_batch, speculative_decode_batch

    if not prompt_ids:
        return
    n = len(prompt_ids)
    for mode, m in advice.modes.items():
        sampling = MODES[mode]
        for B, b in m.batch.items():
            plain_rates, sd_rates = [], []
            for g in range(-(-n // B)):
                prompts = [prompt_ids[(g * B + i) % n] for i in range(B)]
                for run in range(max(int(runs), 1)):
                    seed = derive_seed(advice.config.seed, "advise batch check", B, g, run)   # plain and SD paired
                    plain = autoregressive_decode_batch(target, prompts, tokens, temperature=sampling.temperature,
                                                        seed=seed)
                    plain_rates.append(plain.decode_tokens_per_second)
                    if b.gamma > 0:
                        sd = speculative_decode_batch(target, draft, prompts, tokens, gamma=b.gamma,
                                                      temperature=sampling.temperature, seed=seed)
                        sd_rates.append(sd.decode_tokens_per_second)
            sd_rates = sd_rates or plain_rates
            b.measured_plain, b.measured_speculative = statistics.median(plain_rates), statistics.median(sd_rates)
            b.measured_plain_range = (min(plain_rates), max(plain_rates))
            b.measured_speculative_range = (min(sd_rates), max(sd_rates))
            b.measured_batches = len(plain_rates)


def measure_settings(target, draft, advice: Advice, prompt_ids: list[list[int]], tokens: int, progress=None,
                     runs: int = 1) -> None:
    """Run the recommended setting and a few others on held-out prompts; fill ``Setting.measured`` with
    the measured speed-up over plain decoding (same prompts, same tokens, interleaved per prompt), in
    decode tokens per second (prefill excluded, as in the prediction): the median over prompts of
    each prompt's mean ratio over its ``runs`` runs, plain decoding and every setting paired on each.
    At T > 0 the runs draw different random streams; at greedy they decode the same tokens and differ
    by timing (measured here: one prompt's plain decoding 12.7 and 15.2 tok/s in two runs) and by the
    draft's proposals where llama.cpp's logits depend on how its cache was filled."""
    advice.measured_streams = streams = max(1, int(runs))
    for mode, m in advice.modes.items():
        sampling = MODES[mode]
        chosen = [m.chain[2], m.chain[4], m.chain[8], m.tree[8], m.tree[16]]
        if m.best is not None:
            chosen.append(m.best)
        if m.best_block is not None:         # block verification at its best γ, beside token-wise at that γ
            chosen += [m.best_block, m.chain[m.best_block.size]]
        if m.best_shape is not None:         # the best sampled tree / M drafts (the engine's best, if a shape)
            chosen.append(m.best_shape)
        picks = sorted({s.label: s for s in chosen}.values(), key=lambda s: (s.kind, s.size, s.gamma or 0))
        ratios: dict[str, list[float]] = {s.label: [] for s in picks}
        context_ratios = []
        for k, ids in enumerate(prompt_ids):
            per_prompt: dict[str, list[float]] = {s.label: [] for s in picks}
            per_context = []
            for stream in range(streams):
                seed = derive_seed(advice.config.seed, "advise check", k, *((stream,) if stream else ()))
                plain = autoregressive_decode(target, ids, tokens, temperature=sampling.temperature, seed=seed)
                base = plain.metrics.decode_tokens_per_second
                for setting in picks:
                    res = speculative_decode(target, draft, ids, tokens, temperature=sampling.temperature, seed=seed,
                                             **setting.decode_kwargs())
                    per_prompt[setting.label].append(res.metrics.decode_tokens_per_second / base)
                if m.context is not None:
                    res = speculative_decode(target, None, ids, tokens, temperature=sampling.temperature, seed=seed)
                    per_context.append(res.metrics.decode_tokens_per_second / base)
            for label, values in per_prompt.items():
                ratios[label].append(statistics.fmean(values))
            if per_context:
                context_ratios.append(statistics.fmean(per_context))
        for setting in picks:
            setting.measured = statistics.median(ratios[setting.label])
        if m.context is not None and context_ratios:
            m.context.measured = statistics.median(context_ratios)


def measured_vs_predicted(advice: Advice) -> list[tuple[str, str, float, float, float]]:
    """(mode, setting, predicted, measured, measured/predicted) for every measured setting."""
    rows = []
    for mode, m in advice.modes.items():
        for s in list(m.chain.values()) + list(m.block.values()) + list(m.tree.values()) + m.shapes:
            if s.measured is not None:
                rows.append((mode, s.label, s.predicted, s.measured, s.measured / s.predicted))
    return rows


def batch_table(advice: Advice, mode: str = "greedy") -> dict[int, int]:
    """Draft length per batch size (0 = no speculation at that size): the table vLLM / SGLang users
    otherwise write by hand."""
    m = advice.modes.get(mode) or next(iter(advice.modes.values()))
    return {B: b.gamma for B, b in sorted(m.batch.items())}


# ----------------------------------------------------------------------------------------------- export
def recommendation(advice: Advice, target_path: str, draft_path: str, mode: str = "greedy"):
    """The best setting of ``mode`` as a :class:`specbound.export.Recommendation` for serving engines."""
    from .export import Recommendation

    m = advice.modes.get(mode) or next(iter(advice.modes.values()))
    temperature = MODES[m.mode].temperature
    if not m.pays:
        return Recommendation(target=target_path, draft=None, method="none", num_speculative_tokens=1,
                              temperature=temperature,
                              notes=(f"predicted best speed-up {m.best.predicted:.2f}x < {PAYS}: speculation will not "
                                     "pay on this engine and machine",))
    best = m.best
    note = (f"specbound advise: predicted {best.predicted:.2f}x ({m.mode}); measured "
            f"{'–' if best.measured is None else f'{best.measured:.2f}x'}",)
    if best.kind == "chain":
        return Recommendation(target=target_path, draft=draft_path, method="chain", num_speculative_tokens=best.size,
                              temperature=temperature, notes=note)
    depth = max(1, int(round(math.log2(best.size))) + 1)
    topk = max(1, min(8, int(round(best.size ** (1 / depth)))))
    while sum(topk ** d for d in range(1, depth + 1)) < best.size:
        topk += 1
    return Recommendation(target=target_path, draft=draft_path, method="tree", num_speculative_tokens=depth,
                          tree_capacity=best.size, tree_topk=topk, temperature=temperature, notes=note)


def check_engine(engine: str) -> str:
    if engine not in ("torch", "llamacpp"):
        raise SpecboundError(f"--engine must be 'torch' or 'llamacpp', got {engine!r}")
    return engine


__all__ += ["check_engine", "measured_vs_predicted"]
