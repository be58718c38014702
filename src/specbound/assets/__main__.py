"""``python -m specbound.assets``: see :mod:`specbound.assets.cli`."""
import sys

from .cli import main

sys.exit(main())
