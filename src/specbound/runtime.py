"""Process-level settings that a command sets once at run time (never at import)."""
from __future__ import annotations

import os

__all__ = ["available_cores", "configure_process", "configure_threads"]


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


def configure_process() -> None:
    """Run-time process settings of the command line, applied before torch (and its OpenMP runtime) loads.

    ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy: idle OpenMP workers sleep instead of
    spinning, so a neighbouring process on a 2-core machine does not turn each forward into a fight for
    the cores (measured by ``specbound bench --contention``). Once torch is imported the policy can no
    longer change, so this does nothing then.
    """
    import sys

    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
