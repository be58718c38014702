"""specbound: lossless speculative decoding, and the theory that says how fast it can be."""
__version__ = "0.1.0"
from .errors import ModelNotAvailable, SpecboundError

__all__ = ["ModelNotAvailable", "SpecboundError", "__version__"]
