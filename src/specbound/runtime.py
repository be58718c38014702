"""Process-level settings that a command sets once at run time (never at import)."""
from __future__ import annotations

import os

__all__ = ["available_cores", "configure_threads"]


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
