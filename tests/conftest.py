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


@pytest.fixture(scope="module")
def pair():
    """The tiny HF pair on ``HFModel`` (helpers.tiny_pair defaults: seed 0, vocab 48, draft noise 0.35, seed 1).

    Module scope: built once per test file, shared by that file's tests."""
    from helpers import tiny_pair
    from specbound.models.hf import HFModel

    return tiny_pair(backend=HFModel)


@pytest.fixture(scope="module", params=["dynamic-cache", "static-cache"])
def backend_pair(request):
    """The same tiny pair behind each HF backend (helpers.HF_BACKENDS): the model's own forward over a
    DynamicCache, and the static cache; every test that uses it runs once per backend."""
    from helpers import HF_BACKENDS, tiny_pair

    return tiny_pair(backend=HF_BACKENDS[request.param])
