"""Batch speculative decoding engine (Yin et al. 2024, Alg. 4 / Thm 3) and relaxed decoding (§5, Thm 4/5)
on exact Markov-chain models: losslessness of designs A and B by χ², greedy identity, Monte Carlo
rejections against the exact Thm 3 recursions, a planted-bias mutant, honest call counting and cache
contents, Decoding-OPT/-UNO rejection rates and bias, and bad input."""
import numpy as np
import pytest
import torch

from helpers import DelegatingModel, chain_pair, chi_square_pvalue, encode, processed_chain
from specbound.decoding import BatchDrafter, SamplingConfig, Speculator, autoregressive_decode, speculative_decode
from specbound.decoding import verify as verify_module
from specbound.decoding.engine import make_generator
from specbound.decoding.verify import (
    CandidatesVerdict, DecodingOPT, DecodingUNO, acceptance_probability, over_acceptance_probability,
    recursive_rejection_sampling, residual_distribution, step_output_bias,
)
from specbound.errors import SpecboundError
from specbound.models import ChainModel, LanguageModel
from specbound.theory import expected_rejections
from specbound.theory.distributions import tv
from specbound.theory.rejections import batch_expected_rejections, residual_chain
from specbound.theory.tradeoff import (
    minimal_bias, optimal_residual, output_law, over_acceptance, tradeoff_point, uno_bias,
)

P_MIN = 1e-3          # χ² significance level; seeds are fixed so each outcome is deterministic


def _random_laws(rng, rows, vocab, zeros=True):
    draft = rng.dirichlet(np.full(vocab, 0.7), size=rows)
    target = rng.dirichlet(np.full(vocab, 0.7), size=rows)
    if zeros:                                       # some tokens the draft never proposes (top-k like)
        draft[:, 0] = 0.0
        draft /= draft.sum(-1, keepdims=True)
    return draft, target


# ------------------------------------------------------------------ verification core (vectorised)
@pytest.mark.montecarlo
def test_recursive_rejection_sampling_is_lossless_and_matches_thm3_all_reject():
    rng = np.random.default_rng(0)
    draft_np, target_np = _random_laws(rng, 1, 6)
    rows, m = 40_000, 3
    draft = torch.from_numpy(np.repeat(draft_np, rows, 0))
    target = torch.from_numpy(np.repeat(target_np, rows, 0))
    gen = make_generator(1)
    candidates = torch.multinomial(draft, m, replacement=True, generator=gen)      # i.i.d. draft samples
    verdict = recursive_rejection_sampling(candidates, target=target, draft=draft, generator=gen)
    recovered = torch.multinomial(verdict.residual, 1, generator=gen).squeeze(-1)
    picked = candidates.gather(1, verdict.accepted.clamp(min=0).unsqueeze(1)).squeeze(1)
    emitted = torch.where(verdict.accepted >= 0, picked, recovered).numpy()
    assert chi_square_pvalue(emitted, target_np[0]) > P_MIN
    # all-reject frequency vs ρ_M of Thm 3; the residual returned on all-reject rows is r^M exactly
    residuals, rho = residual_chain(target=target_np[0], draft=draft_np[0], drafts=m)
    all_reject = (verdict.accepted < 0).numpy()
    se = np.sqrt(rho[m] * (1 - rho[m]) / rows)
    assert abs(all_reject.mean() - rho[m]) <= 4 * se, (all_reject.mean(), rho[m], se)   # 4 standard errors
    np.testing.assert_allclose(verdict.residual[all_reject].numpy(), np.broadcast_to(residuals[m], (all_reject.sum(), 6)),
                               atol=1e-12)
    # one candidate = the standard acceptance test and residual of Alg. 1
    one = recursive_rejection_sampling(candidates[:5, :1], target=target[:5], draft=draft[:5],
                                       generator=make_generator(2))
    assert isinstance(one, CandidatesVerdict)
    torch.testing.assert_close(one.residual[one.accepted < 0],
                               residual_distribution(target=target[:5], draft=draft[:5])[one.accepted < 0])


def test_recursive_rejection_respects_the_alive_mask():
    draft = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    target = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)   # every drafted token is rejected
    candidates = torch.tensor([[0, 1, 0]])
    out = recursive_rejection_sampling(candidates, target=target, draft=draft, generator=make_generator(0),
                                       alive=torch.tensor([[False, False, False]]))
    assert int(out.accepted[0]) == -1
    torch.testing.assert_close(out.residual, target)                 # nothing tested: residual untouched
    target = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)    # target = draft: first tested wins
    out = recursive_rejection_sampling(candidates, target=target, draft=draft, generator=make_generator(0),
                                       alive=torch.tensor([[False, True, True]]))
    assert int(out.accepted[0]) == 1


# ------------------------------------------------------------------ relaxed acceptance formulas (Thm 4/5)
@pytest.mark.parametrize("form", ["additive", "ratio"])
def test_over_acceptance_and_bias_match_theory(form):
    rng = np.random.default_rng(7)
    draft, target = _random_laws(rng, 50, 8)
    dt, tt = torch.from_numpy(draft), torch.from_numpy(target)
    for eps in (0.0, 0.01, 0.05, 0.2, 0.8):
        accept = over_acceptance(target=target, draft=draft, eps=eps, form=form)
        torch.testing.assert_close(over_acceptance_probability(target=tt, draft=dt, eps=eps, form=form),
                                   torch.from_numpy(accept), rtol=0, atol=1e-12)
        opt, uno = DecodingOPT(eps, form), DecodingUNO(eps, form)
        b = opt.acceptance(target=tt, draft=dt)
        torch.testing.assert_close(b, uno.acceptance(target=tt, draft=dt))     # same b → same speed
        opt_law = optimal_residual(target=target, draft=draft, accept=accept)
        torch.testing.assert_close(opt.resample_law(target=tt, draft=dt, accept=b), torch.from_numpy(opt_law),
                                   rtol=0, atol=1e-12)
        opt_bias, uno_bias_t = opt.step_bias(target=tt, draft=dt), uno.step_bias(target=tt, draft=dt)
        np.testing.assert_allclose(opt_bias.numpy(), minimal_bias(target=target, draft=draft, accept=accept),
                                   atol=1e-12)
        np.testing.assert_allclose(uno_bias_t.numpy(), uno_bias(target=target, draft=draft, accept=accept), atol=1e-12)
        rejection, bias = tradeoff_point(target=target, draft=draft, accept=accept)
        np.testing.assert_allclose(rejection + bias, tv(draft, target), atol=1e-12)           # Thm 5 line
        assert np.all(uno_bias_t.numpy() >= opt_bias.numpy() - 1e-12)
        law = output_law(draft=draft, accept=accept, resample=opt_law)
        resample = opt.resample_law(target=tt, draft=dt, accept=b)
        np.testing.assert_allclose(step_output_bias(target=tt, draft=dt, accept=b, resample=resample).numpy(),
                                   tv(law, target), atol=1e-12)


# ------------------------------------------------------------------ losslessness (χ² of the first 3 tokens)
SETTINGS = [
    dict(temperature=1.0, gamma=None),
    dict(temperature=0.8, top_k=2, gamma=2),
]
RUNS = 3000


def _law_and_samples(setting, design, drafts=3, runs=RUNS, seed=31):
    target, draft = chain_pair(seed, states=4, noise=0.7)
    tm, dm = ChainModel(target), ChainModel(draft)
    config = SamplingConfig(setting["temperature"], setting.get("top_k"), setting.get("top_p"))
    law = processed_chain(target, config).sequence_law(0, 3)
    samples = np.array([Speculator(tm, BatchDrafter(dm, config, drafts, setting["gamma"], design),
                                   generator=make_generator(i)).run([0], 3).tokens for i in range(runs)])
    return law, samples


@pytest.mark.montecarlo
@pytest.mark.parametrize("design", ["A", "B"])
@pytest.mark.parametrize("setting", SETTINGS, ids=["T=1,horizon", "T=0.8,top_k=2,gamma=2"])
def test_batch_output_law_of_first_three_tokens_is_target_law(setting, design):
    law, samples = _law_and_samples(setting, design)
    assert chi_square_pvalue(encode(samples, 4), law) > P_MIN


def no_residual_update(candidates, *, target, draft, generator=None, alive=None):
    """Planted bug: every candidate is tested against the target itself (the residual is NOT updated
    after a rejected candidate), and the all-reject token comes from the one-step residual."""
    accepted = torch.full((candidates.shape[0],), -1, dtype=torch.long)
    for j in range(candidates.shape[1]):
        testing = accepted < 0 if alive is None else (accepted < 0) & alive[:, j]
        ratio = acceptance_probability(target=target, draft=draft, tokens=candidates[:, j])
        ok = testing & (torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype) < ratio)
        accepted = torch.where(ok, torch.full_like(accepted, j), accepted)
    return CandidatesVerdict(accepted, residual_distribution(target=target, draft=draft), torch.zeros(len(accepted)))


@pytest.mark.montecarlo
@pytest.mark.parametrize("design", ["A", "B"])
def test_chi_square_catches_the_no_residual_update_mutant(design, monkeypatch):
    # same instance, runs and test as the lossless check above (top-k setting: more round starts)
    monkeypatch.setattr(verify_module, "recursive_rejection_sampling", no_residual_update)
    law, samples = _law_and_samples(SETTINGS[1], design)
    assert chi_square_pvalue(encode(samples, 4), law) < P_MIN


# ------------------------------------------------------------------ greedy identity
@pytest.mark.parametrize("design", ["A", "B"])
@pytest.mark.parametrize("gamma", [2, None])
def test_greedy_batch_equals_target_greedy(design, gamma):
    for seed in range(4):
        target, draft = chain_pair(seed, states=6, noise=0.8)
        tm, dm = ChainModel(target), ChainModel(draft)
        ar = autoregressive_decode(tm, [seed % 6, 2], 25, temperature=0.0)
        for drafts in (2, 4):
            sd = speculative_decode(tm, dm, [seed % 6, 2], 25, gamma=gamma, temperature=0.0, seed=seed,
                                    drafts=drafts, design=design)
            assert sd.tokens == ar.tokens
            assert sd.metrics.rejections > 0 and sd.lossless


def test_drafts_one_is_the_chain_engine():
    target, draft = chain_pair(5, states=5)
    tm, dm = ChainModel(target), ChainModel(draft)
    for gamma in (2, None):
        chain = speculative_decode(tm, dm, [1], 12, gamma=gamma, seed=3)
        one = speculative_decode(tm, dm, [1], 12, gamma=gamma, seed=3, drafts=1, design="A")
        assert one.tokens == chain.tokens and one.metrics.rejections == chain.metrics.rejections
        assert one.method == chain.method and chain.method.startswith("chain")


# ------------------------------------------------------------------ Thm 3 by Monte Carlo (horizon mode)
HORIZON = 6
MC_TARGET, MC_DRAFT = chain_pair(8, states=4, horizon=HORIZON, noise=0.7)
MC_RUNS = 2000


@pytest.mark.montecarlo
@pytest.mark.parametrize("drafts, design", [(1, "B"), (2, "A"), (2, "B"), (4, "A"), (4, "B")])
def test_thm3_exact_matches_batch_engine_monte_carlo(drafts, design):
    # BatchDrafter directly, so drafts=1 runs the batch code path too (speculative_decode would
    # hand it to the chain drafter); for M = 1 the exact value is Thm 1's.
    tm, dm = ChainModel(MC_TARGET), ChainModel(MC_DRAFT)
    initial = MC_TARGET.sample(0, size=MC_RUNS, seed=drafts)[:, 0]            # x_0 ~ initial law
    rejections = np.array([
        Speculator(tm, BatchDrafter(dm, SamplingConfig(), drafts, None, design),
                   generator=make_generator(10_000 * drafts + i)).run([int(initial[i])], HORIZON).metrics.rejections
        for i in range(MC_RUNS)
    ])
    exact = batch_expected_rejections(target=MC_TARGET, draft=MC_DRAFT, horizon=HORIZON, drafts=drafts, design=design)
    # SE = sample std / √runs of the per-run rejection count (≈ 0.02–0.03 here)
    se = rejections.std(ddof=1) / np.sqrt(MC_RUNS)
    assert abs(rejections.mean() - exact) <= 4 * se, (rejections.mean(), exact, se)    # 4 standard errors
    if drafts > 1:   # power: the batch improvement over Thm 1 (chain SD) is larger than the tolerance
        assert expected_rejections(target=MC_TARGET, draft=MC_DRAFT, horizon=HORIZON) - exact > 4 * se


# ------------------------------------------------------------------ honest calls and cache contents
class RecordingModel(DelegatingModel):
    """Wraps a ChainModel, keeps the token ids of its cache slots and counts calls; every crop /
    keep_path snapshot of the committed chain is recorded (it must hold committed tokens only)."""

    def __init__(self, inner):
        super().__init__(inner, inner.name)
        self.cache, self.snapshots, self.calls = [], [], 0

    def reset(self):
        self.inner.reset()
        self.cache = []

    def crop(self, length):
        self.inner.crop(length)
        self.cache = self.cache[:length]
        self.snapshots.append(self.cache[:self.inner.committed_length])

    def forward(self, tokens, keep_logits=None):
        self.calls += 1
        self.cache += torch.as_tensor(tokens)[0].tolist()
        return self.inner.forward(tokens, keep_logits)

    def forward_tree(self, tokens, parents):
        self.calls += 1
        self.cache += torch.as_tensor(tokens)[0].tolist()
        return self.inner.forward_tree(tokens, parents)

    def keep_path(self, base_length, path):
        self.inner.keep_path(base_length, path)
        self.cache = self.cache[:base_length] + [self.cache[s] for s in path]
        self.snapshots.append(list(self.cache))


@pytest.mark.parametrize("design", ["A", "B"])
@pytest.mark.parametrize("gamma", [3, None])
def test_one_target_call_per_round_and_caches_hold_committed_tokens_only(design, gamma):
    target, draft = chain_pair(9, states=4, horizon=14, noise=0.8)
    for seed in range(5):
        tm, dm = RecordingModel(ChainModel(target)), RecordingModel(ChainModel(draft))
        res = speculative_decode(tm, dm, [0, 1], 12, gamma=gamma, seed=seed, drafts=3, design=design)
        m, full = res.metrics, [0, 1] + res.tokens
        assert len(res.tokens) == 12 and m.new_tokens == 12
        # calls after the prompt's prefill (one forward of the prompt but its last token)
        assert tm.calls - 1 == m.target_calls == len(m.accepted_per_step)    # ONE target call per round
        assert dm.calls - 1 == m.draft_calls == sum(m.depth_per_step)        # one draft call per depth
        for model in (tm, dm):
            assert all(snap == full[:len(snap)] for snap in model.snapshots)
        if gamma is None:                                                     # every round but the last rejects
            last_rejected = m.accepted_per_step[-1] < m.depth_per_step[-1]
            assert m.target_calls == m.rejections + (0 if last_rejected else 1)
            assert sum(m.accepted_per_step) + m.rejections == 12


# ------------------------------------------------------------------ relaxed decoding (Decoding-OPT / -UNO)
RELAX_RUNS = 6000


def _first_token_runs(relaxation):
    target, draft = chain_pair(42, states=6, noise=0.9)
    tm, dm = ChainModel(target), ChainModel(draft)
    tokens, rejected, bias = np.empty(RELAX_RUNS, dtype=np.int64), np.empty(RELAX_RUNS), np.empty(RELAX_RUNS)
    for i in range(RELAX_RUNS):
        res = speculative_decode(tm, dm, [0], 1, seed=i, relaxation=relaxation)
        tokens[i], rejected[i], bias[i] = res.tokens[0], res.metrics.rejections, res.metrics.expected_bias
    assert not res.lossless and res.metrics.bias_positions == 1
    return target.transitions[0], draft.transitions[0], tokens, rejected, bias


@pytest.mark.montecarlo
def test_relaxed_opt_and_uno_same_rejections_opt_bias_on_thm4_and_below_uno():
    eps = 0.05
    target, draft, opt_tokens, opt_rej, opt_bias = _first_token_runs(("opt", eps))
    _, _, uno_tokens, uno_rej, uno_bias_runs = _first_token_runs(("uno", eps))
    accept = over_acceptance(target=target, draft=draft, eps=eps)
    rejection, loss_opt = tradeoff_point(target=target, draft=draft, accept=accept)
    loss_uno = float(uno_bias(target=target, draft=draft, accept=accept))
    # same b → same rejection rate: each within 4 SE of 1 − Σ draft·b, and of each other
    se = np.sqrt(rejection * (1 - rejection) / RELAX_RUNS)
    assert abs(opt_rej.mean() - rejection) <= 4 * se and abs(uno_rej.mean() - rejection) <= 4 * se
    assert abs(opt_rej.mean() - uno_rej.mean()) <= 4 * np.sqrt(2) * se
    # the engine's bias metric is the exact one-step loss (fixed context, one token)
    np.testing.assert_allclose(opt_bias, loss_opt, atol=1e-12)
    np.testing.assert_allclose(uno_bias_runs, loss_uno, atol=1e-12)
    # measured output laws: OPT follows draft·b + (1 − β)·P* (χ²), and its TV to the target is Loss*
    opt_law = output_law(draft=draft, accept=accept, resample=optimal_residual(target=target, draft=draft,
                                                                               accept=accept))
    uno_law = output_law(draft=draft, accept=accept, resample=target)
    assert chi_square_pvalue(opt_tokens, opt_law) > P_MIN
    assert chi_square_pvalue(uno_tokens, uno_law) > P_MIN
    emp_opt = np.bincount(opt_tokens, minlength=6) / RELAX_RUNS
    emp_uno = np.bincount(uno_tokens, minlength=6) / RELAX_RUNS
    # |TV(emp, target) − TV(law, target)| ≤ TV(emp, law), whose mean is ≤ s = ½ Σ √(law(1 − law)/N); allow 4 s
    s_opt = 0.5 * np.sqrt(opt_law * (1 - opt_law) / RELAX_RUNS).sum()
    s_uno = 0.5 * np.sqrt(uno_law * (1 - uno_law) / RELAX_RUNS).sum()
    assert abs(float(tv(emp_opt, target)) - loss_opt) <= 4 * s_opt, (tv(emp_opt, target), loss_opt, s_opt)
    assert abs(float(tv(emp_uno, target)) - loss_uno) <= 4 * s_uno
    assert loss_uno >= loss_opt + 0.1 and float(tv(emp_uno, target)) > float(tv(emp_opt, target))
    assert loss_opt > 8 * s_opt                     # the bias is far from sampling noise (test has power)


def test_relaxed_sequence_metrics_and_eps_zero_is_standard_sd():
    target, draft = chain_pair(5, states=5, noise=0.8)
    tm, dm = ChainModel(target), ChainModel(draft)
    for gamma in (3, None):
        lossless = speculative_decode(tm, dm, [1], 15, gamma=gamma, seed=4)
        zero = speculative_decode(tm, dm, [1], 15, gamma=gamma, seed=4, relaxation=("opt", 0.0))
        assert zero.tokens == lossless.tokens and not zero.lossless
        assert abs(zero.metrics.expected_bias) < 1e-12
        for name in ("opt", "uno"):
            res = speculative_decode(tm, dm, [1], 15, gamma=gamma, seed=4, relaxation=(name, 0.2, "ratio"))
            m = res.metrics
            assert not res.lossless and len(res.tokens) == 15 and res.method.endswith(f"{name}(eps=0.2, ratio)")
            # verified positions: every accepted drafted token and every rejected one (bonus tokens add none)
            assert m.expected_bias > 0 and m.bias_positions == sum(m.accepted_per_step) + m.rejections
            assert m.as_dict()["expected_bias"] == m.expected_bias


# ------------------------------------------------------------------ bad input
def test_bad_input_errors():
    target, draft = chain_pair(0, states=4)
    tm, dm = ChainModel(target), ChainModel(draft)

    class NoTree(LanguageModel):
        vocab_size, name = 4, "no-tree"

        def reset(self):
            tm.reset()

        @property
        def cache_length(self):
            return tm.cache_length

        def crop(self, length):
            tm.crop(length)

        def forward(self, tokens, keep_logits=None):
            return tm.forward(tokens, keep_logits)

    cases = [
        (dict(drafts=0), "drafts"),
        (dict(drafts=-2), "drafts"),
        (dict(drafts=1.5), "drafts"),
        (dict(drafts=True), "drafts"),
        (dict(drafts=2, design="C"), "design"),
        (dict(design="C"), "design"),
        (dict(relaxation=("opt", -0.1)), "eps"),
        (dict(relaxation=("opt", float("nan"))), "eps"),
        (dict(relaxation=("typical", 0.1)), "unknown relaxation"),
        (dict(relaxation="opt"), "relaxation must be"),
        (dict(relaxation=("opt", 0.1, "multiplicative")), "form"),
        (dict(relaxation=("uno", 0.1), drafts=2), "one-draft"),
        (dict(drafts=2, gamma=0), "gamma"),
        (dict(drafts=2, gamma="auto"), "gamma"),
        (dict(drafts=2, tree=4), "tree"),
    ]
    for kwargs, match in cases:
        with pytest.raises(SpecboundError, match=match):
            speculative_decode(tm, dm, [0], 4, **kwargs)
    with pytest.raises(SpecboundError, match="forward_tree"):
        speculative_decode(NoTree(), dm, [0], 4, drafts=2)
    with pytest.raises(SpecboundError, match="eps"):
        DecodingOPT(-1.0)
