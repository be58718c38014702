"""Errors raised on bad input. Each message names the offending argument and what was expected."""


class SpecboundError(ValueError):
    """Bad input to specbound: the message says which argument and why."""


class ModelNotAvailable(SpecboundError):
    """A model path, packaged model or optional dependency is missing on this machine."""
