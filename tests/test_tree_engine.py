"""Tree speculative decoding on exact Markov-chain models (Pankratov & Alistarh 2026, §1–§2).

Losslessness of both tree verification rules by χ², greedy identity for every drafter, tree forward
= separate forwards per branch (written over a model factory so HF backends can reuse it), the
oracle drafter realising E[X | T*] of theory.optimal_tree, a planted-bias mutant caught by the same
χ² test, one target call per round, and bad input.
"""
import math
import sys

import numpy as np
import pytest
import torch

from helpers import DelegatingModel, chain_pair, chi_square_pvalue, encode, processed_chain
from specbound.decoding import (
    DraftTree, DynamicTreeDrafter, OracleTreeDrafter, SampledTreeDrafter, SamplingConfig, Speculator,
    autoregressive_decode, speculative_decode,
)
from specbound.decoding.drafters import make_tree_drafter
from specbound.decoding.engine import make_generator
from specbound.decoding.verify import Verdict, verify
from specbound.errors import SpecboundError
from specbound.models import ChainModel, LanguageModel
from specbound.theory import MarkovChain, optimal_tree
from test_batch_engine import no_residual_update

P_MIN = 1e-3          # χ² significance level; seeds are fixed so each outcome is deterministic
RUNS = 3000           # decodes per χ² test (4 states, 3 tokens: 64 cells, ≈ 47 expected per cell)


# ------------------------------------------------------------------ tree forward = per-branch forwards
def branch(parents, i):
    """Tree indices on the path root → node i."""
    path = []
    while i >= 0:
        path.append(i)
        i = int(parents[i])
    return path[::-1]


def assert_tree_forward_matches_branches(model: LanguageModel, prefix, tokens, parents, atol=1e-6, rtol=1e-5):
    """Backend-generic check of ``forward_tree``/``keep_path`` (reuse it for any LanguageModel).

    ``parents`` are tree indices (−1 = the last prefix token). (1) After reading ``prefix``, ONE
    ``forward_tree`` call returns, for every node, the logits a plain forward of prefix +
    (root-to-node path) returns; the cache grows by n. (2) Growing the same tree one depth per call,
    each call attaching nodes under cached nodes, gives the same logits. (3) After ``keep_path`` of a
    deep branch, a plain forward continues exactly as on prefix + that branch. (4) ``crop`` after a
    tree forward restores the prefix.
    """
    tokens, parents = list(tokens), list(parents)
    depths = DraftTree(tokens, parents).depths.tolist()
    refs = []
    for i in range(len(tokens)):
        model.reset()
        seq = list(prefix) + [tokens[j] for j in branch(parents, i)]
        refs.append(model.forward(torch.tensor([seq]))[0, -1])
    model.reset()
    model.forward(torch.tensor([list(prefix)]))
    base = model.cache_length

    def slot_of(j):
        return base - 1 if j < 0 else base + j

    out = model.forward_tree(torch.tensor([tokens]), [slot_of(p) for p in parents])
    assert out.shape == (1, len(tokens), model.vocab_size)
    assert model.cache_length == base + len(tokens)
    for i, ref in enumerate(refs):
        torch.testing.assert_close(out[0, i], ref, atol=atol, rtol=rtol, msg=f"node {i}")
    # (2) level by level: the nodes of depth d in one call, under parents cached by earlier calls
    model.crop(base)
    slots = {-1: base - 1}
    for d in range(1, max(depths) + 1):
        level = [i for i in range(len(tokens)) if depths[i] == d]
        start = model.cache_length
        rows = model.forward_tree(torch.tensor([[tokens[i] for i in level]]), [slots[parents[i]] for i in level])[0]
        for j, i in enumerate(level):
            slots[i] = start + j
            torch.testing.assert_close(rows[j], refs[i], atol=atol, rtol=rtol, msg=f"node {i} read at depth {d}")
    deepest = max(range(len(tokens)), key=lambda i: (depths[i], i))
    path = branch(parents, deepest)
    model.keep_path(base, [slots[i] for i in path])
    assert model.cache_length == base + len(path)
    nxt = model.forward(torch.tensor([[tokens[0]]]))[0, -1]
    model.reset()
    ref = model.forward(torch.tensor([list(prefix) + [tokens[j] for j in path] + [tokens[0]]]))[0, -1]
    torch.testing.assert_close(nxt, ref, atol=atol, rtol=rtol)
    model.reset()
    ref = model.forward(torch.tensor([list(prefix) + [tokens[0]]]))[0, -1]
    model.reset()
    model.forward(torch.tensor([list(prefix)]))
    model.forward_tree(torch.tensor([tokens]), [slot_of(p) for p in parents])
    model.crop(base)
    torch.testing.assert_close(model.forward(torch.tensor([[tokens[0]]]))[0, -1], ref, atol=atol, rtol=rtol)


def random_tree(vocab, n, seed):
    """A random tree of n nodes (parents precede children; sibling tokens may repeat)."""
    rng = np.random.default_rng(seed)
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    tokens = rng.integers(0, vocab, size=n).tolist()
    return tokens, parents


MODEL_FACTORIES = {
    "chain-stationary": lambda: ChainModel(MarkovChain.random(5, seed=3)),
    "chain-finite-horizon": lambda: ChainModel(MarkovChain.random(5, horizon=16, seed=4)),
}


@pytest.mark.parametrize("factory", MODEL_FACTORIES.values(), ids=MODEL_FACTORIES.keys())
def test_tree_forward_equals_separate_forwards_per_branch(factory):
    model = factory()
    for seed in range(3):
        tokens, parents = random_tree(model.vocab_size, 9, seed)
        assert_tree_forward_matches_branches(model, [1, 4, 2], tokens, parents)
    # the engine's layout: pending committed tokens as a leading chain, the draft tree below it
    assert_tree_forward_matches_branches(model, [1], [3, 0, 2, 2, 1], [-1, 0, 1, 1, 2])


# ------------------------------------------------------------------ losslessness (χ²)
SETTINGS = {"T=1": SamplingConfig(1.0), "T=0.8,top_k=2": SamplingConfig(0.8, top_k=2)}
DRAFTERS = {
    "dynamic": lambda tm, dm, cfg, P: DynamicTreeDrafter(dm, cfg, P, width=2),
    "sampled": lambda tm, dm, cfg, P: SampledTreeDrafter(dm, cfg, P, branching=(3, 2, 1)),
    "chain": lambda tm, dm, cfg, P: SampledTreeDrafter(dm, cfg, P, branching=(1,)),
    "oracle": lambda tm, dm, cfg, P: OracleTreeDrafter(tm, cfg, P),
}


def _law_and_samples(drafter, config, runs=RUNS, capacity=6, seed=31):
    target, draft = chain_pair(seed)
    tm, dm = ChainModel(target), ChainModel(draft)
    law = processed_chain(target, config).sequence_law(0, 3)
    samples = np.empty((runs, 3), dtype=np.int64)
    for i in range(runs):
        eng = Speculator(tm, DRAFTERS[drafter](tm, dm, config, capacity), config, generator=make_generator(i))
        samples[i] = eng.run([0], 3).tokens
    return law, samples


@pytest.mark.montecarlo
@pytest.mark.parametrize("setting", SETTINGS, ids=SETTINGS)
@pytest.mark.parametrize("drafter", ["dynamic", "sampled"])
def test_first_three_tokens_have_target_law(drafter, setting):
    # dynamic → deterministic-tree rule; sampled (3 i.i.d. children at the root) → multi-draft rule
    law, samples = _law_and_samples(drafter, SETTINGS[setting])
    assert chi_square_pvalue(encode(samples, 4), law) > P_MIN


@pytest.mark.montecarlo
def test_oracle_and_chain_drafters_are_lossless_too():
    config = SETTINGS["T=0.8,top_k=2"]
    for drafter in ("oracle", "chain"):
        law, samples = _law_and_samples(drafter, config, runs=2000)
        assert chi_square_pvalue(encode(samples, 4), law) > P_MIN, drafter


@pytest.mark.montecarlo
def test_verification_rules_alone_give_the_target_law():
    # pure functions: a depth-2 tree, first two emitted tokens (accepted path + next token)
    gen, runs = make_generator(5), 8000
    target = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.6, 0.2, 0.2], [0.3, 0.3, 0.4]], dtype=torch.float64)
    draft = torch.tensor([[0.2, 0.2, 0.6], [0.3, 0.3, 0.4], [0.2, 0.6, 0.2], [0.5, 0.25, 0.25]], dtype=torch.float64)
    law = target[0][:, None] * target[1:]            # exact law of (x1, x2); row t+1 = law after token t
    det, multi = np.empty((runs, 2), np.int64), np.empty((runs, 2), np.int64)
    for i in range(runs):
        # deterministic tree: root children 0 and 2, node "0" has child 1
        tokens = [0, 2, 1]
        v = verify(DraftTree(tokens, [-1, -1, 0]), target[[0] + [t + 1 for t in tokens]], generator=gen)
        det[i] = _first_two(tokens, v, target, gen)
        # sampled tree: 3 i.i.d. root children from draft[0], each with 1 child from draft[its token]
        kids = torch.multinomial(draft[0], 3, replacement=True, generator=gen).tolist()
        grand = [int(torch.multinomial(draft[k + 1], 1, generator=gen)) for k in kids]
        tokens, parents = kids + grand, [-1, -1, -1, 0, 1, 2]
        laws_of = [0] + [t + 1 for t in tokens]        # row of each slot: after token t is row t+1
        v = verify(DraftTree(tokens, parents, draft[laws_of], sampled=True), target[laws_of], generator=gen)
        multi[i] = _first_two(tokens, v, target, gen)
    law = law.numpy()
    assert chi_square_pvalue(encode(det, 3), law) > P_MIN
    assert chi_square_pvalue(encode(multi, 3), law) > P_MIN


def _first_two(tokens, verdict: Verdict, target, gen):
    out = [tokens[i] for i in verdict.path] + [verdict.next_token]
    while len(out) < 2:                                # continue from the target itself
        out.append(int(torch.multinomial(target[out[-1] + 1], 1, generator=gen)))
    return out[:2]


@pytest.mark.montecarlo
def test_chi_square_catches_the_no_residual_update_mutant(monkeypatch):
    # multi-draft verification that tests every sibling against the *target* law (no residual update
    # after a rejected sibling), recovering from the one-draft residual: planted in the shared core
    monkeypatch.setattr(sys.modules["specbound.decoding.verify"], "recursive_rejection_sampling", no_residual_update)
    law, samples = _law_and_samples("sampled", SETTINGS["T=1"])
    assert chi_square_pvalue(encode(samples, 4), law) < P_MIN


# ------------------------------------------------------------------ greedy identity
@pytest.mark.parametrize("drafter", ["dynamic", "sampled", "chain", "oracle"])
def test_greedy_tree_speculation_equals_target_greedy(drafter):
    calls = 0
    for seed in range(4):
        target, draft = chain_pair(seed, states=6, noise=0.8)
        tm, dm = ChainModel(target), ChainModel(draft)
        sd = speculative_decode(tm, dm, [seed % 6, 2], 30, tree=5, tree_drafter=drafter, temperature=0.0, seed=seed)
        ar = autoregressive_decode(tm, [seed % 6, 2], 30, temperature=0.0)
        assert sd.tokens == ar.tokens
        calls += sd.metrics.target_calls
        if drafter == "oracle":          # greedy target: T* is the arg-max chain, all P accepted + bonus
            assert sd.metrics.accepted_per_step == [5] * 5
    assert calls < 4 * 30                # drafts were accepted somewhere: verification did work


def test_finite_horizon_chain_decodes_to_its_horizon():
    target, draft = chain_pair(7, states=4, horizon=12)
    tm, dm = ChainModel(target), ChainModel(draft)
    for drafter in ("dynamic", "sampled", "oracle"):
        res = speculative_decode(tm, dm, [0], 12, tree=8, tree_drafter=drafter, seed=1)
        assert len(res.tokens) == 12


# ------------------------------------------------------------------ oracle drafter realises E[X | T*]
def _chain_next_probs(chain: MarkovChain, context: int):
    """Target law after context + path on a stationary chain (theory side, no model)."""
    return lambda path: chain.transitions[path[-1] if path else context]


@pytest.mark.montecarlo
@pytest.mark.parametrize("capacity", [1, 4, 16])
def test_oracle_mean_accepted_length_matches_exact_optimal_tree_value(capacity):
    chain = MarkovChain.random(6, concentration=0.5, seed=8)          # stationary, T = 1
    exact = np.array([optimal_tree(_chain_next_probs(chain, c), capacity).value for c in range(6)])
    model = ChainModel(chain)
    config = SamplingConfig(1.0)
    eng = Speculator(model, OracleTreeDrafter(model, config, capacity), config, generator=make_generator(capacity))
    budget = 2400
    res = eng.run([0], budget)
    seq = [0] + res.tokens
    end = 1 + budget
    # rounds whose tree was not shortened by the budget (remaining > depth ≤ P)
    rounds = [r for r in res.rounds if end - r.committed > capacity]
    x = np.array([r.accepted for r in rounds], dtype=np.float64)
    e = np.array([exact[seq[r.committed - 1]] for r in rounds])
    np.testing.assert_allclose([r.value for r in rounds], e, rtol=1e-9)   # the oracle's own T* value
    # X − E[X|T*(context)] are martingale differences: mean 0, SE from their spread
    diff = x - e
    se = diff.std(ddof=1) / math.sqrt(len(diff))
    assert abs(diff.mean()) <= 4 * se, (x.mean(), e.mean(), se, len(diff))     # 4 standard errors
    assert len(rounds) >= 300
    assert all(r.size == capacity for r in rounds)


# ------------------------------------------------------------------ one target call per round, caches
class CountingModel(DelegatingModel):
    def __init__(self, inner):
        super().__init__(inner, "counting")
        self.forwards = self.tree_forwards = 0

    def forward(self, tokens, keep_logits=None):
        self.forwards += 1
        return self.inner.forward(tokens, keep_logits)

    def forward_tree(self, tokens, parents):
        self.tree_forwards += 1
        return self.inner.forward_tree(tokens, parents)


@pytest.mark.parametrize("drafter", ["dynamic", "sampled", "chain"])
def test_one_target_forward_tree_per_round_and_committed_cache(drafter):
    target, draft = chain_pair(3, states=5)
    tm = CountingModel(ChainModel(target))
    dm = ChainModel(draft)
    config = SamplingConfig(1.0)
    eng = Speculator(tm, make_tree_drafter(drafter, tm, dm, config, 7), config, generator=make_generator(0))
    res = eng.run([0, 1, 2], 60)
    # the prompt prefill, then ONE target read per round (forward for chain-shaped trees, else forward_tree)
    assert tm.forwards - 1 + tm.tree_forwards == res.metrics.target_calls == len(res.rounds)
    if drafter != "chain":
        assert tm.tree_forwards > 0
    assert sum(r.accepted + (r.ended != "budget") for r in res.rounds) >= 60
    assert res.metrics.tau > 1.0 and res.metrics.mean_accepted > 0
    assert len(res.metrics.accepted_per_step) == res.metrics.target_calls
    assert max(res.metrics.drafted_per_step) <= 7


# ------------------------------------------------------------------ bad input
def test_bad_input_errors():
    target, draft = chain_pair(0, states=4)
    tm, dm = ChainModel(target), ChainModel(draft)
    other = ChainModel(MarkovChain.random(5, seed=0))
    probs = torch.full((3, 4), 0.25)
    cases = [
        (lambda: speculative_decode(tm, dm, [0], 4, tree=0), "tree"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=-2), "tree"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=2.5), "tree"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=True), "tree"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=4, tree_drafter="eagle"), "tree_drafter"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree_drafter="oracle"), "needs tree"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=4, gamma=2), "not both"),
        (lambda: speculative_decode(tm, other, [0], 4, tree=4), "vocabulary mismatch"),
        (lambda: speculative_decode(tm, None, [0], 4, tree=4, tree_drafter="sampled"), "draft model"),
        (lambda: speculative_decode(tm, dm, [0], -1, tree=4), "max_new_tokens"),
        (lambda: speculative_decode(tm, dm, [0], 4, tree=4, temperature=-1), "temperature"),
        (lambda: SampledTreeDrafter(dm, SamplingConfig(), 4, branching=(2, 0)), "branching"),
        (lambda: DynamicTreeDrafter(dm, SamplingConfig(), 4, width=0), "width"),
        (lambda: verify(DraftTree([0, 1], [-1, 1]), probs), "parent"),
        (lambda: verify(DraftTree([0, 0], [-1, -1]), probs), "distinct sibling"),
        (lambda: verify(DraftTree([0, 7], [-1, 0]), probs), "outside"),
        (lambda: verify(DraftTree([0], [-1]), probs), r"\[n\+1, V\]"),
        (lambda: verify(DraftTree([0, 1], [-1, 0], torch.tensor([[0., 1, 0, 0]] * 3), sampled=True), probs),
         "draft probability 0"),
        (lambda: verify(DraftTree([0, 1], [-1, 0], probs, sampled=True), probs,
                        torch.tensor([True, False, True])), "no target law"),
        (lambda: DraftTree([0, 1], [-1, 0], sampled=True), "draft_probs"),
    ]
    for call, match in cases:
        with pytest.raises(SpecboundError, match=match):
            call()
    # the oracle needs no draft model
    assert len(speculative_decode(tm, None, [0], 5, tree=3, tree_drafter="oracle", seed=0).tokens) == 5


def test_callback_streams_every_round():
    target, draft = chain_pair(2, states=4)
    chunks = []
    res = speculative_decode(ChainModel(target), ChainModel(draft), [0], 25, tree=4, seed=3, callback=chunks.append)
    assert [t for c in chunks for t in c] == res.tokens and len(chunks) == res.metrics.target_calls
