"""`specbound reproduce yin`, Fig. 4 in kind: the rejection/bias Pareto front of over-acceptance
(Yin et al. 2024, Thm 4, Thm 5) on a random V = 10 instance — standard SD at (TV, 0), Decoding-OPT on
the line rej + bias = TV, Decoding-UNO above it — checked against an LP and, by Monte Carlo, against
the verification core's Decoding-OPT/-UNO rules."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..decoding import DecodingOPT, DecodingUNO, make_generator
from ..measure.llm import torch_threads
from ..seeds import derive_seed
from ..theory.distributions import tv
from ..theory.tradeoff import lp_minimal_bias, over_acceptance, pareto_front
from .report import Stage
from .yin import Settings

__all__ = ["CoreMC", "Fig4", "Fig4Curve", "Fig4Form", "core_one_step_mc", "fig4_instance", "run_fig4"]


@dataclass
class CoreMC:
    rejection: float
    rejection_se: float
    empirical_bias: float
    rows: int


@dataclass
class Fig4Form:
    rejection: list[float]
    opt_bias: list[float]
    uno_bias: list[float]
    lp_opt_bias: list[float]
    identity_max_abs_error: float
    lp_max_abs_error: float
    uno_min_excess_where_rejecting: float | None
    core_mc: list[dict[str, CoreMC]]


@dataclass
class Fig4Curve:
    eps: list[float]
    rejection: list[float]
    opt_bias: list[float]
    uno_bias: list[float]


@dataclass
class Fig4:
    vocab: int
    draft: list[float]
    target: list[float]
    tv: float
    eps: list[float]
    forms: dict[str, Fig4Form]
    dense: dict[str, Fig4Curve]
    instance: str = "draft, target ~ Dirichlet(1) from numpy default_rng([seed, 4, vocab])"


def fig4_instance(seed: int = 0, vocab: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Random single-step instance (draft, target), both Dirichlet(1) over ``vocab`` tokens: a problem
    instance named by ``seed`` and ``vocab``, not a random stream (:mod:`specbound.seeds`)."""
    rng = np.random.default_rng([seed, 4, vocab])
    draft = rng.dirichlet(np.ones(vocab))
    target = rng.dirichlet(np.ones(vocab))
    return draft, target


def core_one_step_mc(draft, target, eps: float, form: str, rows: int, seed: int) -> dict[str, CoreMC]:
    """Monte Carlo of one relaxed step with the verification core's rule objects (:class:`DecodingOPT`
    / :class:`DecodingUNO` of :mod:`specbound.decoding.verify`): draw x ~ draft, accept with the rule's
    b(x) against one uniform, else emit a token of the rule's resampling law — the sampled-chain step of
    :func:`~specbound.decoding.verify.verify` for one position, vectorised over ``rows`` (``verify``
    takes one tree per call, ~0.4 ms, too slow for 10⁵ one-step trials). OPT and UNO share the drafted
    tokens and uniforms (same b, hence the same rejections)."""
    import torch

    out = {}
    vocab = len(draft)
    d = torch.from_numpy(np.asarray(draft)).reshape(1, vocab).expand(rows, vocab)
    t = torch.from_numpy(np.asarray(target)).reshape(1, vocab).expand(rows, vocab)
    with torch_threads(1):
        for name, rule in (("opt", DecodingOPT(float(eps), form)), ("uno", DecodingUNO(float(eps), form))):
            gen = make_generator(seed)
            tokens = torch.multinomial(d, 1, replacement=True, generator=gen)[:, 0]
            accept_all = rule.acceptance(target=t, draft=d)
            ratio = accept_all.gather(-1, tokens[:, None])[:, 0]
            uniforms = torch.rand(ratio.shape, generator=gen, dtype=ratio.dtype)
            rejected = ~(uniforms < ratio)
            emitted = tokens.clone()
            if bool(rejected.any()):
                law = rule.resample_law(target=t, draft=d, accept=accept_all)
                drawn = torch.multinomial(law, 1, generator=gen)[:, 0]
                emitted = torch.where(rejected, drawn, tokens)
            freq = np.bincount(emitted.numpy(), minlength=vocab) / rows
            rej = rejected.numpy().astype(np.float64)
            out[name] = CoreMC(rejection=float(rej.mean()), rejection_se=float(rej.std(ddof=1) / math.sqrt(rows)),
                               empirical_bias=float(tv(freq, target)), rows=rows)
    return out


def run_fig4(s: Settings, progress=None) -> Fig4:
    draft, target = fig4_instance(s.seed, s.vocab)
    distance = float(tv(draft, target))
    eps_points = np.asarray(s.eps_points, dtype=np.float64)
    eps_dense = np.concatenate([[0.0], np.geomspace(1e-3, 1.0, 90)])
    stage = Stage(progress, "Fig. 4 Pareto + core MC", 2 * len(eps_points))
    forms, dense = {}, {}
    for form in ("additive", "ratio"):
        front = pareto_front(target=target, draft=draft, eps_grid=eps_points, form=form)
        dense_front = pareto_front(target=target, draft=draft, eps_grid=eps_dense, form=form)
        lp, core = [], []
        for i, eps in enumerate(eps_points):
            accept = over_acceptance(target=target, draft=draft, eps=eps, form=form)
            lp.append(lp_minimal_bias(target=target, draft=draft, accept=accept)[0])
            core.append(core_one_step_mc(draft, target, eps, form, s.core_mc_rows,
                                         seed=derive_seed(s.seed, "yin fig4 core", i)))     # both forms: paired
            stage.advance()
        rej, bias, uno = front.rejection, front.bias, front.uno_bias
        has_rej = rej > 1e-12
        forms[form] = Fig4Form(
            rejection=rej.tolist(), opt_bias=bias.tolist(), uno_bias=uno.tolist(), lp_opt_bias=lp,
            identity_max_abs_error=float(np.max(np.abs(rej + bias - distance))),
            lp_max_abs_error=float(np.max(np.abs(np.asarray(lp) - bias))),
            uno_min_excess_where_rejecting=float(np.min((uno - bias)[has_rej])) if has_rej.any() else None,
            core_mc=core)
        dense[form] = Fig4Curve(eps=eps_dense.tolist(), rejection=dense_front.rejection.tolist(),
                                opt_bias=dense_front.bias.tolist(), uno_bias=dense_front.uno_bias.tolist())
    return Fig4(vocab=s.vocab, draft=draft.tolist(), target=target.tolist(), tv=distance, eps=eps_points.tolist(),
                forms=forms, dense=dense)
