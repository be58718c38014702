import sys
from pathlib import Path

import pytest
import torch

# Tests run tiny models: one intra-op thread avoids OpenMP spin overhead (10x on a loaded 2-core box).
torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def no_model_loads(monkeypatch):
    """Every model loader refuses: a command that loads a model before checking its arguments fails."""
    from specbound.models import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    for name in ("load_pair", "load_model", "load_engine_pair"):
        monkeypatch.setattr(loading, name, refuse)
