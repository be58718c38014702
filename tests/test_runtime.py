"""The command line's OpenMP wait policy (runtime.py): PASSIVE only where the machine is busy."""
import os
import subprocess
import sys
import time

import pytest

from specbound.runtime import omp_wait_policy, other_load


def test_policy_choices():
    assert omp_wait_policy("passive") == "PASSIVE"
    assert omp_wait_policy("spin") is None
    assert omp_wait_policy("auto", load=0.9) == "PASSIVE"      # a neighbour holds most of a core
    assert omp_wait_policy("auto", load=0.05) is None          # quiet: libgomp's default (spin, then sleep)
    with pytest.raises(ValueError):
        omp_wait_policy("sometimes")


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_other_load_sees_a_cpu_hog():
    """One process spinning on a core is seen as ~1 core of load (≥ 0.5 allows for a slow start and
    scheduling noise); the same measurement without it is what `auto` compares with 0.25."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert other_load(0.3) >= 0.5
    finally:
        hog.kill()
        hog.wait()


def test_bad_choice_is_one_error_line():
    env = dict(os.environ, SPECBOUND_OMP_WAIT="sometimes")
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    done = subprocess.run([sys.executable, "-m", "specbound.cli", "theory", "--drafts", "1"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "specbound: error: SPECBOUND_OMP_WAIT must be one of auto, passive, spin, got 'sometimes'"
