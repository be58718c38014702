"""Moved to :mod:`specbound.measure.journal` (the measurement layer); this name stays for callers not yet
moved (``specbound bench``'s command)."""
from ..measure.journal import PARTIAL_NAME, PartialResults, no_journal

__all__ = ["PARTIAL_NAME", "PartialResults", "no_journal"]
