"""Process-level settings that a command sets once at run time (never at import)."""
from __future__ import annotations

import os

__all__ = ["OMP_WAIT_CHOICES", "available_cores", "configure_process", "configure_threads", "omp_wait_policy",
           "other_load"]


def available_cores() -> int:
    """CPU cores this process may run on (affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def configure_threads(requested: int = 0) -> int:
    """Set torch's intra-op threads to ``requested`` (0 = the cores available); returns the count."""
    import torch

    from .errors import SpecboundError

    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
        raise SpecboundError(f"--threads must be an integer >= 0 (0 = the cores available), got {requested!r}")
    threads = requested or available_cores()
    torch.set_num_threads(threads)
    return threads


#: ``SPECBOUND_OMP_WAIT``: how the command line sets OpenMP's wait policy before torch loads.
OMP_WAIT_CHOICES = ("auto", "passive", "spin")


def other_load(seconds: float = 0.2) -> float:
    """Cores' worth of CPU time the rest of the machine used over ``seconds`` (this process is idle
    meanwhile): busy jiffies of /proc/stat minus this process's own, over the interval. 0.0 where
    /proc/stat cannot be read."""
    import time

    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)          # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8]), os.times()

    try:
        busy0, total0, own0 = sample()
        time.sleep(seconds)
        busy1, total1, own1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = (own1.user + own1.system - own0.user - own0.system) * ticks
    cores = os.cpu_count() or 1
    if total1 <= total0:
        return 0.0
    return max(0.0, (busy1 - busy0 - own) / (total1 - total0) * cores)


def sustained_load(samples: int = 3, seconds: float = 0.15) -> float:
    """The least :func:`other_load` over ``samples`` back-to-back intervals: the load a neighbour keeps up,
    not a process that happened to exit (or a pip step that just ended) during one short sample."""
    return min(other_load(seconds) for _ in range(max(1, samples)))


#: PASSIVE above this many cores kept busy by other processes in every sample
SUSTAINED_LOAD = 0.5


def omp_wait_policy(choice: str, load: float | None = None) -> str | None:
    """The ``OMP_WAIT_POLICY`` a command should start with: ``"PASSIVE"`` or None (libgomp's default:
    spin a while, then sleep).

    Measured (docs/results/contention, 2 cores): on a quiet machine the default makes plain decoding
    ~1.5× and speculative decoding ~1.45× faster than PASSIVE (llama.cpp ~1.6×: both OpenMP runtimes
    in the process read the variable); beside one busy neighbour it makes them 3–4× SLOWER than
    PASSIVE. ``"auto"`` therefore looks at the machine first: PASSIVE when other processes keep more
    than half a core busy through three samples (:func:`sustained_load`; one 0.2 s sample flipped the
    choice between runs on a quiet machine), else the default."""
    if choice not in OMP_WAIT_CHOICES:
        raise ValueError(choice)
    if choice == "passive":
        return "PASSIVE"
    if choice == "spin":
        return None
    return "PASSIVE" if (sustained_load() if load is None else load) > SUSTAINED_LOAD else None


def configure_process() -> None:
    """Run-time process settings of the command line, applied before torch (and its OpenMP runtime) loads.

    OpenMP's wait policy, unless the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``: chosen by
    ``SPECBOUND_OMP_WAIT`` = ``auto`` (default: PASSIVE only if the machine is busy, see
    :func:`omp_wait_policy`), ``passive`` or ``spin``. Once torch is imported the policy can no
    longer change, so this does nothing then.
    """
    import sys

    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    choice = os.environ.get("SPECBOUND_OMP_WAIT", "auto").strip().lower()
    if choice not in OMP_WAIT_CHOICES:       # the command line's one error format, before any parsing
        print(f"specbound: error: SPECBOUND_OMP_WAIT must be one of {', '.join(OMP_WAIT_CHOICES)}, got {choice!r}",
              file=sys.stderr)
        raise SystemExit(2)
    policy = omp_wait_policy(choice)
    if policy is not None:
        os.environ["OMP_WAIT_POLICY"] = policy
