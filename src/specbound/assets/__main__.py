"""``python -m specbound.assets ...``: the same as ``specbound assets ...`` (:mod:`specbound.cli.assets`)."""
import sys

from specbound.cli import main

sys.exit(main(["assets", *sys.argv[1:]]))
