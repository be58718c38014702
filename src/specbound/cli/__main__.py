"""``python -m specbound.cli``: the same as the ``specbound`` command."""
import sys

from . import main

sys.exit(main())
