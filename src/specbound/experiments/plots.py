"""Figures of the studies (matplotlib, Agg backend: no display needed).

The Yin et al. figures take plain numbers; the Pankratov & Alistarh figures take the typed results
of :mod:`.analyze` and :mod:`.pankratov`. Each draws one figure and writes it with
:func:`.report.save_figure`. Nothing here measures or computes theory.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.font_manager import FontProperties  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

from .report import save_figure  # noqa: E402

__all__ = ["advise_speedups", "yin_fig2_running", "yin_fig2_scaling", "yin_fig3", "yin_fig4"]

_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _wrap(text: str, width_inches: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_inches`` at ``fontsize`` points (a character is taken
    as ~0.5 em wide), so a long title never runs past its axes or figure."""
    chars = max(24, int(width_inches * 72 / (0.5 * fontsize)))
    return textwrap.fill(text, chars, break_long_words=False, break_on_hyphens=False)


def _set_title(ax, text: str, fontsize=None) -> None:
    """``ax.set_title`` with the title wrapped to the axes' width."""
    size = FontProperties(size=fontsize if fontsize is not None else plt.rcParams["axes.titlesize"]).get_size_in_points()
    ax.set_title(_wrap(text, ax.get_position().width * ax.figure.get_figwidth(), size), fontsize=size)


def _suptitle(fig, text: str, fontsize: float = 10) -> None:
    """``fig.suptitle`` wrapped to the figure's width."""
    fig.suptitle(_wrap(text, 0.95 * fig.get_figwidth(), fontsize), fontsize=fontsize)


def _log2_y(ax, values) -> None:
    """A log-2 y axis with plain-number tick labels (0.25, 0.5, 1, 2, …) spanning the finite positive
    ``values``: speed-ups from a quarter to tens of × each keep their differences visible."""
    v = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in values]) if len(values) else np.zeros(0)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return
    ax.set_yscale("log", base=2)
    ax.set_ylim(min(0.8, float(v.min())) / 1.15, float(v.max()) * 1.3)
    ax.yaxis.set_major_locator(LogLocator(base=2))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))


def _running_mean(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Running mean and standard error after 1..N runs (SE from the running variance)."""
    values = np.asarray(values, dtype=np.float64)
    n = np.arange(1, len(values) + 1)
    mean = np.cumsum(values) / n
    sq = np.cumsum(values ** 2) / n
    var = np.clip(sq - mean ** 2, 0.0, None) * n / np.maximum(n - 1, 1)
    return n, mean, np.sqrt(var / n)


def yin_fig2_running(path, title: str, series: list[dict], horizon: int) -> Path:
    """Running Monte Carlo average of N_rej against the number of runs (Yin et al. 2024, Fig. 2a/b).

    ``series``: dicts with ``label``, ``samples`` (N_rej per run, NumPy MC), ``exact`` (theory
    value), ``exact_label``, optional ``engine`` = (runs, mean, se) of the decoding engine and
    optional ``extra_exact`` = list of (value, label) horizontal reference lines (e.g. design A).
    """
    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    for i, s in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        n, mean, se = _running_mean(s["samples"])
        ax.plot(n, mean, color=color, lw=1.2, label=f"{s['label']}: running MC average (NumPy), band ±2 SE")
        start = min(10, len(n) - 1)
        ax.fill_between(n[start:], (mean - 2 * se)[start:], (mean + 2 * se)[start:], color=color, alpha=0.15,
                        lw=0)
        ax.axhline(s["exact"], color=color, ls="--", lw=1.4, label=s["exact_label"])
        for value, label in s.get("extra_exact", []):
            ax.axhline(value, color=color, ls=":", lw=1.2, label=label)
        if s.get("engine") is not None:
            runs, emean, ese = s["engine"]
            ax.errorbar([runs], [emean], yerr=[2 * ese], fmt="s", color=color, mfc="white", capsize=4,
                        label=f"{s['label']}: decoding engine, {runs} runs (±2 SE)")
    ax.set_xscale("log")
    ax.set_xlabel("number of Monte Carlo runs")
    ax.set_ylabel(r"average number of rejections $N_{rej}$")
    _set_title(ax, title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    secondary = ax.secondary_yaxis("right", functions=(lambda y: horizon / np.maximum(y, 1e-9),
                                                       lambda s: horizon / np.maximum(s, 1e-9)))
    secondary.set_ylabel(f"speed-up T / N_rej (T = {horizon})")
    return save_figure(fig, path)


def yin_fig2_scaling(path, title: str, drafts, exact_b, exact_a, limit_b: float, sd_value: float,
                     mc_points: list[dict], horizon: int) -> Path:
    """E[N_rej] of batch SD against the number of drafts M (Yin et al. 2024, Fig. 2c).

    ``mc_points``: dicts with ``drafts``, ``mean``, ``se``, ``design`` (NumPy Monte Carlo).
    """
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    drafts = np.asarray(drafts)
    ax.plot(drafts, exact_b, "-o", ms=3.5, color=_COLORS[0], label="design B exact (Thm 3 recursion)")
    ax.plot(drafts, exact_a, "-^", ms=3.5, color=_COLORS[1], label="design A exact (prefix-tree DFS, derived variant)")
    ax.axhline(limit_b, color=_COLORS[0], ls="--", lw=1.2, label=f"design B limit M→∞ (Prop 1) = {limit_b:.3f}")
    ax.axhline(sd_value, color="gray", ls=":", lw=1.2, label=f"SD, M = 1 (Thm 1) = {sd_value:.3f}")
    for design, color, marker in (("B", _COLORS[0], "s"), ("A", _COLORS[1], "D")):
        pts = [p for p in mc_points if p["design"] == design]
        if pts:
            ax.errorbar([p["drafts"] for p in pts], [p["mean"] for p in pts], yerr=[2 * p["se"] for p in pts],
                        fmt=marker, color=color, mfc="white", ms=7, capsize=3,
                        label=f"design {design} Monte Carlo (±2 SE)")
    ax.set_xlabel("number of draft sequences M")
    ax.set_ylabel(r"$E[N_{rej}]$")
    ax.set_xticks(drafts[::2] if len(drafts) > 10 else drafts)
    _set_title(ax, title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    secondary = ax.secondary_yaxis("right", functions=(lambda y: horizon / np.maximum(y, 1e-9),
                                                       lambda s: horizon / np.maximum(s, 1e-9)))
    secondary.set_ylabel(f"speed-up T / E[N_rej] (T = {horizon})")
    return save_figure(fig, path)


def yin_fig3(path, bernoulli: list[dict], uniform: list[dict]) -> Path:
    """Batch improvement TV − ρ_M against M for Bernoulli and uniform pairs (Yin et al. 2024, Fig. 3).

    Each entry: ``label``, ``drafts``, ``closed`` (closed form), ``recursive`` (residual chain).
    """
    fig, axes = plt.subplots(2, 1, figsize=(9.6, 7.6), sharex=True)
    for ax, rows, name in ((axes[0], bernoulli, "Bernoulli pairs: draft Ber(a), target Ber(c)"),
                           (axes[1], uniform, "Uniform pairs: draft U(k tokens), target U(m of them)")):
        for i, row in enumerate(rows):
            color = _COLORS[i % len(_COLORS)]
            ax.plot(row["drafts"], row["closed"], "-", color=color, lw=1.5, label=f"{row['label']} closed form")
            ax.plot(row["drafts"], row["recursive"], "o", color=color, mfc="none", ms=5,
                    label=f"{row['label']} residual chain")
        ax.set_ylabel("batch improvement  TV − ρ_M\n(one round start)")
        _set_title(ax, name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[1].set_xlabel("number of draft sequences M")
    drafts_all = sorted({int(m) for rows in (bernoulli, uniform) for row in rows for m in row["drafts"]})
    axes[1].set_xticks([m for m in drafts_all if m == 1 or m % 2 == 0])
    _suptitle(fig, "Batch improvement saturates in M (lines: closed forms, circles: recursive residuals)")
    return save_figure(fig, path)


def yin_fig4(path, tv: float, points: dict, dense: dict, eps_points,
             title: str = "Over-acceptance trade-off (OPT points lie on the line, UNO points above it)") -> Path:
    """Pareto front and ε sweep for over-acceptance (Yin et al. 2024, Fig. 4, Thm 4/5).

    ``points[form]``: dict with ``rejection``, ``opt_bias``, ``uno_bias`` at ``eps_points``;
    ``dense[form]``: the same over a dense ``eps`` grid (key ``eps``).
    """
    fig, axes = plt.subplots(1, 3, figsize=(15.5, 4.8))
    ax = axes[0]
    ax.fill([0, tv, 0], [0, 0, tv], color="gray", alpha=0.25, lw=0, label="unattainable: rej + bias < TV")
    ax.text(0.22 * tv, 0.25 * tv, "unattainable\n(below the line)", fontsize=9, color="dimgray", ha="center")
    ax.plot([0, tv], [tv, 0], "k-", lw=1.5, label=f"Pareto line rej + bias = TV = {tv:.4f} (Thm 5)")
    styles = {"additive": ("o", "s"), "ratio": ("x", "^")}
    for form, pts in points.items():
        opt_marker, uno_marker = styles.get(form, ("o", "s"))
        ax.plot(pts["opt_bias"], pts["rejection"], opt_marker, color=_COLORS[0], ms=7,
                mfc="none" if opt_marker == "o" else None, label=f"Decoding-OPT, {form} ε")
        ax.plot(pts["uno_bias"], pts["rejection"], uno_marker, color=_COLORS[3], ms=6, mfc="none",
                label=f"Decoding-UNO, {form} ε")
    ax.annotate("standard SD (ε = 0)", (0, tv), xytext=(0.55 * tv, 1.07 * tv), fontsize=8,
                arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.annotate("accept all (b ≡ 1)", (tv, 0), xytext=(1.05 * tv, 0.25 * tv), fontsize=8,
                arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.set_xlabel("distribution bias  TV(output law, target)")
    ax.set_ylabel("rejection probability  1 − Σ draft·b")
    ax.set_xlim(-0.02 * tv, 1.5 * tv)
    ax.set_ylim(-0.02 * tv, 1.15 * tv)
    _set_title(ax, "Pareto front: rejection vs bias")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)

    line_styles = {"additive": "-", "ratio": "--"}
    eps_points = np.asarray(eps_points, dtype=np.float64)
    for form, d in dense.items():
        ls = line_styles.get(form, "-")
        axes[1].plot(d["eps"], d["rejection"], ls, color=_COLORS[0], label=f"rejection, {form} ε")
        axes[2].plot(d["eps"], d["opt_bias"], ls, color=_COLORS[0], label=f"Decoding-OPT bias, {form} ε")
        axes[2].plot(d["eps"], d["uno_bias"], ls, color=_COLORS[3], label=f"Decoding-UNO bias, {form} ε")
        pts = points[form]
        keep = eps_points > 0
        axes[1].plot(eps_points[keep], np.asarray(pts["rejection"])[keep], "o", color=_COLORS[0], mfc="none", ms=5)
        axes[2].plot(eps_points[keep], np.asarray(pts["opt_bias"])[keep], "o", color=_COLORS[0], mfc="none", ms=5)
        axes[2].plot(eps_points[keep], np.asarray(pts["uno_bias"])[keep], "s", color=_COLORS[3], mfc="none", ms=5)
    axes[1].axhline(tv, color="gray", ls=":", lw=1.0, label="TV (standard SD, ε = 0)")
    axes[2].axhline(tv, color="gray", ls=":", lw=1.0, label="TV (accept all)")
    for ax, ylabel, panel_title in ((axes[1], "rejection probability", "Rejection vs over-acceptance ε"),
                                    (axes[2], "distribution bias (TV)", "Bias vs over-acceptance ε")):
        ax.set_xscale("log")
        ax.set_xlabel("over-acceptance threshold ε (log scale)")
        ax.set_ylabel(ylabel)
        _set_title(ax, panel_title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    _suptitle(fig, title)
    return save_figure(fig, path)


# ===================================================================================================
# Pankratov & Alistarh 2026 (specbound analyze / reproduce pankratov): typed results of .analyze /
# .pankratov (SetAnalysis, SyntheticChecks, MomentRow).
# ===================================================================================================
__all__ += ["pankratov_expected_accepted", "pankratov_speedup", "pankratov_fig2", "pankratov_synthetic",
            "pankratov_moments"]

_PK_FORM_STYLE = {  # bound form -> (line style, colour, label)
    "published": (":", "#7f7f7f", "published (μ+μ₂)lnP/μ² (a bound for P ≥ 3 only)"),
    "renewal": ("-", "#d62728", "renewal lnP/μ + μ₂/μ²"),
    "threshold": ("-.", "#ff7f0e", "best threshold"),
    "asymptotic": ("--", "#9467bd", "asymptotic ln(μP)/μ + μ₂/2μ² − 1 (not a bound)"),
}
_PK_DRAFTER_STYLE = {"chain": ("v-", "#2ca02c", "chain drafter (γ = P)"),
                     "dynamic": ("D-", "#1f77b4", "dynamic tree drafter"),
                     "sampled": ("^-", "#17becf", "sampled tree drafter")}


def _pk_none(values) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


def _pk_log2_x(ax, caps) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(caps)
    ax.set_xticklabels([str(c) for c in caps])
    ax.set_xlabel("capacity P (draft-tree nodes per target call, log scale)")
    ax.grid(alpha=0.3, which="both")


def _pk_expected_axes(ax, result, title: str | None = None) -> None:
    caps = np.asarray(result.config.capacities, dtype=np.float64)
    bounds = result.bounds
    top_candidates = [np.nanmax(_pk_none(bounds["renewal"]))]
    oracle = result.oracle
    if oracle:
        top_candidates.append(np.nanmax(_pk_none(oracle.mean)))
    ymax = 1.3 * max(top_candidates)
    for form, (ls, color, label) in _PK_FORM_STYLE.items():
        y = _pk_none(bounds[form])
        if np.nanmax(y) > ymax:
            label += f" (off-scale: {np.nanmax(y):.1f} at P={int(caps[-1])})"
        ax.plot(caps, y, ls, color=color, lw=1.6, label=label)
    if oracle:
        ax.errorbar(caps, _pk_none(oracle.mean), yerr=2 * np.nan_to_num(_pk_none(oracle.se)), fmt="*-",
                    color="black", ms=9, capsize=3, lw=1.4,
                    label=f"oracle E[X|T*(P)], exact ({oracle.n_positions} positions, ±2 SE)")
    sd = result.oracle_sd.by_capacity if result.oracle_sd else {}
    if sd:
        ps = sorted(sd)
        ax.errorbar(ps, _pk_none([sd[p].mean_X for p in ps]), yerr=2 * np.nan_to_num(_pk_none([sd[p].diff_se for p in ps])),
                    fmt="o", color="black", mfc="white", ms=7, capsize=3, label="oracle tree SD: mean accepted X (±2 SE)")
    for kind, runs in result.drafters.items():
        style, color, label = _PK_DRAFTER_STYLE.get(kind, ("s-", "#8c564b", kind))
        ps = sorted(runs.by_capacity)
        measured = [runs.by_capacity[p].mean_accepted for p in ps]
        exact = result.drafter_exact.of(kind) if result.drafter_exact else None
        if exact is not None and exact.mean:
            se = exact.se or [0.0] * len(caps)
            ax.errorbar(caps, _pk_none(exact.mean), yerr=2 * np.nan_to_num(_pk_none(se)), fmt=style,
                        color=color, ms=5, capsize=2, label=f"{label}: exact E[X|T] at oracle positions (±2 SE)")
            ax.plot(ps, measured, style[0], color=color, ms=6, mfc="none", alpha=0.7,
                    label=f"{label}: mean accepted in SD runs (few rounds)")
        else:
            ax.plot(ps, measured, style, color=color, ms=5, label=f"{label}: mean accepted")
    ax.set_ylim(0, ymax)
    _pk_log2_x(ax, [int(c) for c in caps])
    ax.set_ylabel("E[X] = accepted draft tokens per target call")
    m = result.moments
    _set_title(ax, title or f"{result.set}: μ = {m.mu:.3f}, μ₂ = {m.mu2:.3f} nats (n = {m.n})", fontsize=10)


def pankratov_expected_accepted(result, path) -> Path:
    """E[X] vs P (log-x): bound forms, exact and empirical oracle, real drafters (one prompt set)."""
    fig, ax = plt.subplots(figsize=(8.2, 5.4))
    _pk_expected_axes(ax, result)
    ax.legend(fontsize=7.5, loc="upper left")
    return save_figure(fig, path)


def _pk_speedup_axes(ax_const, ax_wall, result, legend: bool = True) -> None:
    rows = result.speedups.rows
    caps = [r.P for r in rows]
    kinds = list(result.drafters)

    def const(key):
        return _pk_none([r.const.get(key) for r in rows])

    def wall(key):
        return _pk_none([r.wall.get(key) for r in rows])

    if ax_const is not None:
        ax_const.plot(caps, const("renewal"), "-", color=_PK_FORM_STYLE["renewal"][1], label="bound: renewal + 1")
        ax_const.plot(caps, const("threshold"), "-.", color=_PK_FORM_STYLE["threshold"][1],
                      label="bound: best threshold + 1")
        if "oracle" in rows[0].const:
            ax_const.plot(caps, const("oracle"), "*-", color="black", ms=9, label="oracle T*(P): E[X*] + 1")
        sd = const("oracle_sd")
        if np.isfinite(sd).any():
            ax_const.plot(caps, sd, "o", color="black", mfc="white", ms=7, label="oracle tree SD: measured τ")
        for k in kinds:
            style, color, label = _PK_DRAFTER_STYLE.get(k, ("s-", "#8c564b", k))
            if f"{k}_exact" in rows[0].const:
                ax_const.plot(caps, const(f"{k}_exact"), style, color=color, ms=5, label=f"{label}: exact E[X|T] + 1")
                ax_const.plot(caps, const(k), style[0], color=color, ms=6, mfc="none", alpha=0.7,
                              label=f"{label}: τ in SD runs")
            else:
                ax_const.plot(caps, const(k), style, color=color, ms=5, label=f"{label}: τ")
        _pk_log2_x(ax_const, caps)
        _log2_y(ax_const, [line.get_ydata() for line in ax_const.get_lines()])
        ax_const.set_ylabel("speed-up = τ, constant-time model (log scale)")
        _set_title(ax_const, f"{result.set}: constant-time model (drafting free, one call = t(1))", fontsize=9.5)
        if legend:
            ax_const.legend(fontsize=7, loc="upper left")
    if ax_wall is not None:
        ax_wall.plot(caps, wall("renewal_free_drafting"), "-", color=_PK_FORM_STYLE["renewal"][1],
                     label="bound: (renewal + 1)·t(1)/t(P+1), free drafting")
        if "oracle_free_drafting" in rows[0].wall:
            ax_wall.plot(caps, wall("oracle_free_drafting"), "*-", color="black", ms=9,
                         label="oracle: (E[X*] + 1)·t(1)/t(P+1), free drafting")
        for k in kinds:
            style, color, label = _PK_DRAFTER_STYLE.get(k, ("s-", "#8c564b", k))
            key = f"{k}_exact" if f"{k}_exact" in rows[0].wall else k
            ax_wall.plot(caps, wall(key), style, color=color, ms=5,
                         label=f"{label}: τ·t(1)/(draft + t(P+1))" + (" (exact τ)" if key.endswith("exact") else ""))
        ax_wall.axhline(1.0, color="gray", lw=1, ls=":", label="plain decoding")
        _pk_log2_x(ax_wall, caps)
        _log2_y(ax_wall, [line.get_ydata() for line in ax_wall.get_lines()])
        ax_wall.set_ylabel("wall-clock speed-up (log scale)")
        _set_title(ax_wall, f"{result.set}: wall-clock estimate on this CPU", fontsize=9.5)
        if legend:
            ax_wall.legend(fontsize=7, loc="upper left")


def pankratov_speedup(result, path) -> Path:
    """Speed-up vs P: constant-time model (left) and measured-cost wall-clock estimate (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 5.0))
    _pk_speedup_axes(axes[0], axes[1], result)
    return save_figure(fig, path)


def pankratov_fig2(results: list, path) -> Path:
    """Fig. 2 in kind: speed-up vs P for the bound, the oracle and the real drafters, one column per
    prompt set; top row constant-time model, bottom row wall-clock estimate."""
    n = len(results)
    fig, axes = plt.subplots(2, n, figsize=(5.6 * n, 9.0), squeeze=False)
    for j, res in enumerate(results):
        _pk_speedup_axes(axes[0, j], axes[1, j], res, legend=(j == 0))
    _suptitle(fig, "Speed-up vs capacity P: bound vs oracle T*(P) vs real drafters "
                   "(Pankratov & Alistarh, Fig. 2 in kind)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def pankratov_synthetic(synth, path) -> Path:
    """i.i.d. checks: E[X*] vs ln P per distribution with the fitted slope and 1/μ (left), and
    slope·μ with the ±5% band (right)."""
    cases = synth.cases
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 5.0), gridspec_kw={"width_ratios": [2.2, 1]})
    ax = axes[0]
    for i, c in enumerate(cases):
        color = _COLORS[i % len(_COLORS)]
        P = np.asarray(c.P, dtype=np.float64)
        ax.plot(np.log(P), c.value, "-", color=color, lw=1.6, label=f"{c.name}: E[X*] (μ = {c.mu:.3f})")
        ax.plot(np.log(P), c.asymptotic, "--", color=color, lw=1.0, alpha=0.8)
        ax.plot(np.log(P), c.renewal, ":", color=color, lw=1.0, alpha=0.8)
    ax.plot([], [], "k--", lw=1.0, label="asymptotic ln(μP)/μ + μ₂/2μ² − 1")
    ax.plot([], [], "k:", lw=1.0, label="renewal bound lnP/μ + μ₂/μ²")
    ax.set_xlabel("ln P")
    ax.set_ylabel("E[X | T*(P)]")
    _set_title(ax, "Optimal-tree value in i.i.d. environments (lines: exact best-first search)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    ax = axes[1]
    names = [c.name.split()[0] for c in cases]   # short ids (T3a, ...); full names in the left legend
    ratio = np.array([c.slope * c.mu for c in cases])
    err = np.array([2 * (c.slope_se or 0.0) * c.mu for c in cases])
    y = np.arange(len(cases))
    ax.axvspan(0.95, 1.05, color="green", alpha=0.12, label="±5%")
    ax.axvline(1.0, color="green", lw=1)
    ax.errorbar(ratio, y, xerr=err, fmt="o", color="black", capsize=3)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=9)
    ax.invert_yaxis()
    lo, hi = min(0.9, float(np.min(ratio - err)) - 0.02), max(1.1, float(np.max(ratio + err)) + 0.02)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("fitted slope of E[X*] vs ln P, times μ (theory: 1)")
    _set_title(ax, "slope · μ", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def pankratov_moments(rows: list, path) -> Path:
    """The moments table (:class:`~.pankratov.MomentRow` s) as grouped bars: μ and μ₂ (with ±2 SE) per
    model × prompt set."""
    sets = list(dict.fromkeys(r.set for r in rows))
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4))
    width = 0.8 / max(len(models), 1)
    for ax, key, se_key, label in ((axes[0], "mu", "se_mu_prompt", "μ = E[H] (nats)"),
                                   (axes[1], "mu2", "se_mu2_prompt", "μ₂ = E[Σ p ln² p] (nats²)")):
        for i, model in enumerate(models):
            vals, errs = [], []
            for s in sets:
                r = next((r for r in rows if r.set == s and r.model == model), None)
                vals.append(np.nan if r is None else getattr(r.moments, key))
                se = None if r is None else getattr(r.moments, se_key)
                errs.append(0.0 if se is None or not np.isfinite(se) else 2 * se)
            ax.bar(np.arange(len(sets)) + (i - (len(models) - 1) / 2) * width, vals, width, yerr=errs,
                   capsize=3, color=_COLORS[i % len(_COLORS)], label=model)
        ax.set_xticks(np.arange(len(sets)))
        ax.set_xticklabels(sets)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    _suptitle(fig, "Surprisal moments on each model's own T = 1 samples (±2 SE across prompts)")
    return save_figure(fig, path)


# ===================================================================================================
# specbound advise: its typed Advice (.advise).
# ===================================================================================================
def _measured(settings: dict) -> list[tuple[int, float]]:
    return [(x, settings[x].measured) for x in sorted(settings) if settings[x].measured is not None]


def advise_speedups(advice, path) -> Path:
    """`specbound advise`'s figure, one row per mode: chains (left) and dynamic trees (middle), predicted
    and measured speed-ups over plain decoding on axes scaled to them; the ceilings — the speed of
    light (the target's optimal tree T*(P) drafted for free, with this cost curve) and the (μ, μ₂) bound
    — on a panel of their own (right, log scale), beside the best predicted setting, since they sit an
    order of magnitude above what a real draft reaches and would flatten the measured points."""
    modes = list(advice.modes.values())
    fig, axes = plt.subplots(len(modes), 3, figsize=(15.0, 4.0 * len(modes)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.25, 1.0, 1.0]})
    for row, m in zip(axes, modes):
        ax = row[0]
        g = sorted(m.chain)
        ax.plot(g, [m.chain[x].predicted for x in g], "-", color=_COLORS[0], label="chain, predicted")
        if _measured(m.chain):
            ax.plot(*zip(*_measured(m.chain)), "o", color=_COLORS[0], label="chain, measured")
        if m.block:
            b = sorted(m.block)
            ax.plot(b, [m.block[x].predicted for x in b], "--", color=_COLORS[2],
                    label="chain, block verification, predicted")
            if _measured(m.block):
                ax.plot(*zip(*_measured(m.block)), "s", color=_COLORS[2], mfc="white",
                        label="chain, block verification, measured")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="plain decoding")
        ax.set_xlabel("chain length γ")
        ax.set_ylabel("speed-up over plain decoding")
        _set_title(ax, f"{m.mode}: chains")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5)
        ax = row[1]
        P = sorted(m.tree)
        ax.plot(P, [m.tree[x].predicted for x in P], "-", color=_COLORS[1], label="dynamic tree, predicted")
        if _measured(m.tree):
            ax.plot(*zip(*_measured(m.tree)), "o", color=_COLORS[1], label="dynamic tree, measured")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="plain decoding")
        if m.speed_of_light:
            top = max(m.speed_of_light, key=m.speed_of_light.get)
            ax.text(0.98, 0.96, f"speed of light: {m.speed_of_light[top]:.1f}× at P = {top}\n(right panel)",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8, color=_COLORS[2])
        if P:
            _pk_log2_x(ax, P)
        ax.set_xlabel("tree capacity P (log scale)")
        ax.set_ylabel("speed-up over plain decoding")
        _set_title(ax, f"{m.mode}: dynamic trees")
        ax.legend(fontsize=7.5, loc="lower left")
        ax = row[2]
        lines = []
        if m.speed_of_light:
            sl = sorted(m.speed_of_light)
            lines.append([m.speed_of_light[x] for x in sl])
            ax.plot(sl, lines[-1], "--", color=_COLORS[2], label="speed of light: T*(P), free drafting")
        if m.bound_speedup:
            bs = sorted(m.bound_speedup)
            lines.append([m.bound_speedup[x] for x in bs])
            ax.plot(bs, lines[-1], ":", color=_COLORS[3], label="bound (μ, μ₂), free drafting")
        best, measured = m.best_engine, m.best_measured
        if best is not None:
            lines.append([best.predicted])
            ax.axhline(best.predicted, color=_COLORS[0], lw=1.2,
                       label=f"best predicted: {best.label}, {best.predicted:.2f}×")
        if measured is not None:
            lines.append([measured.measured])
            ax.axhline(measured.measured, color=_COLORS[0], lw=1.2, ls="-.",
                       label=f"best measured: {measured.label}, {measured.measured:.2f}×")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="plain decoding")
        lines.append([1.0])
        caps = sorted(set(m.speed_of_light) | set(m.bound_speedup))
        if caps:
            _pk_log2_x(ax, caps)
            ax.set_xlabel("tree capacity P (log scale)")
        _log2_y(ax, lines)
        ax.set_ylabel("speed-up over plain decoding (log scale)")
        _set_title(ax, f"{m.mode}: the ceilings")
        ax.legend(fontsize=7.5, loc="best")
    _suptitle(fig, f"specbound advise ({advice.config.engine}): target {advice.models['target']} ← draft "
                   f"{advice.models['draft']}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
