"""The command line's OpenMP wait policy (runtime.py): PASSIVE only where the machine is busy."""
import os
import subprocess
import sys
import time

import pytest

from specbound.runtime import SUSTAINED_LOAD, omp_wait_policy, other_load, sustained_load


def test_policy_choices():
    assert omp_wait_policy("passive") == "PASSIVE"
    assert omp_wait_policy("spin") is None
    assert omp_wait_policy("auto", load=0.9) == "PASSIVE"      # a neighbour holds most of a core
    assert omp_wait_policy("auto", load=0.05) is None          # quiet: libgomp's default (spin, then sleep)
    assert omp_wait_policy("auto", load=0.4) is None           # less than half a core kept busy
    with pytest.raises(ValueError):
        omp_wait_policy("sometimes")


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_other_load_sees_a_cpu_hog():
    """One process spinning on a core is seen as ~1 core of load (≥ 0.5 allows for a slow start and
    scheduling noise), in each of the samples ``auto`` takes."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert other_load(0.3) >= 0.5
        assert sustained_load() > SUSTAINED_LOAD
    finally:
        hog.kill()
        hog.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_a_burst_that_ends_is_not_sustained_load():
    """A neighbour that spins for 0.1 s and exits (a set-up step ending as the command starts) does
    not make ``auto`` choose PASSIVE: it is absent from the later samples."""
    burst = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.1: pass"])
    try:
        assert sustained_load(samples=3, seconds=0.15) <= SUSTAINED_LOAD or _machine_busy()
    finally:
        burst.wait()


def _machine_busy() -> bool:
    """Other work on the machine (a parallel test run) makes the burst test meaningless, not failed."""
    return other_load(0.3) > SUSTAINED_LOAD


def test_bad_choice_is_one_error_line():
    env = dict(os.environ, SPECBOUND_OMP_WAIT="sometimes")
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    done = subprocess.run([sys.executable, "-m", "specbound.cli", "theory", "--drafts", "1"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "specbound: error: SPECBOUND_OMP_WAIT must be one of auto, passive, spin, got 'sometimes'"
