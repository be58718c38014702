"""Errors raised on bad input. Each message names the offending argument and what was expected."""


class SpecboundError(ValueError):
    """Bad input to specbound: the message says which argument and why."""


class ModelNotAvailable(SpecboundError):
    """A model path, packaged model or optional dependency is missing on this machine."""


def int_at_least(value, minimum: int, what: str) -> int:
    """``value`` as an int ≥ ``minimum`` (Python or NumPy integer; bools and floats rejected), else a clear error."""
    import operator

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise SpecboundError(f"{what} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise SpecboundError(f"{what} must be an integer >= {minimum}, got {value!r} of type "
                             f"{type(value).__name__}") from None
    if number < minimum:
        raise SpecboundError(f"{what} must be an integer >= {minimum}, got {number}")
    return number


def positive_int(value, what: str) -> int:
    """``value`` as an int ≥ 1 (Python or NumPy integer; bools and floats rejected), else a clear error."""
    return int_at_least(value, 1, what)
