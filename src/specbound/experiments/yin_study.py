"""`specbound reproduce yin`, the study: :class:`~.yin.Settings` in, :class:`YinResult` out.

:func:`run` measures Fig. 2 and Fig. 3 (:mod:`.yin`), Fig. 4 (:mod:`.yin_pareto`) and Table 1
(:mod:`.yin_table1`) in that order and times each; :mod:`.yin_report` renders the result (summary.md,
results.json, the figures) and the command (``cli/reproduce/yin.py``) only parses, runs and writes.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field

import numpy as np

from ..measure.journal import PartialResults
from ..measure.records import not_written
from .yin import Fig2, Fig3, Settings, run_fig2, run_fig3
from .yin_pareto import Fig4, run_fig4
from .yin_table1 import Table1, run_table1

__all__ = ["FIGURES_SECONDS", "YinResult", "run"]

#: Seconds --quick keeps for the figures and the report (subtracted from Table 1's share).
FIGURES_SECONDS = 5.0


@dataclass
class YinResult:
    """Everything ``reproduce yin`` measured (JSON: ``results.json``; the raw Fig. 2 samples are not
    written, only drawn)."""

    command: str
    config: Settings
    machine: dict[str, str]
    fig2: Fig2
    fig3: Fig3
    fig4: Fig4
    table1: Table1
    runtime_seconds: dict[str, float] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    paper: str = "Yin, Chen, Huang, Wang 2024, A Theoretical Perspective for Speculative Decoding Algorithm"
    fig2_samples: dict[str, np.ndarray] | None = not_written()   # NumPy Monte Carlo of each Fig. 2 row


def _machine() -> dict[str, str]:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads())}


def run(settings: Settings, progress=None, journal: PartialResults | None = None,
        command: str = "specbound reproduce yin") -> YinResult:
    """Fig. 2, Fig. 3, Fig. 4, then Table 1 (its units through ``journal``, for ``--resume``), each
    timed in ``runtime_seconds``. With ``settings.quick_total_seconds`` set (``--quick`` without
    ``--llm-minutes``), Table 1's time budget is what the figures left of it."""
    s = settings
    start = time.perf_counter()
    runtime = {}
    t = time.perf_counter()
    fig2, samples = run_fig2(s, progress)
    runtime["fig2"] = time.perf_counter() - t
    t = time.perf_counter()
    fig3 = run_fig3(s)
    runtime["fig3"] = time.perf_counter() - t
    t = time.perf_counter()
    fig4 = run_fig4(s, progress)
    runtime["fig4"] = time.perf_counter() - t
    t = time.perf_counter()
    if s.quick_total_seconds is not None:
        s.llm_budget = max(0.0, s.quick_total_seconds - (t - start) - FIGURES_SECONDS)
    table1 = run_table1(s, progress, journal)
    runtime["table1"] = time.perf_counter() - t
    return YinResult(command=command, config=s, machine=_machine(), fig2=fig2, fig3=fig3, fig4=fig4, table1=table1,
                     runtime_seconds=runtime, fig2_samples=samples)
