import sys
from pathlib import Path

import torch

# Tests run tiny models: one intra-op thread avoids OpenMP spin overhead (10x on a loaded 2-core box).
torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
