"""b2b/cpu_load.py: how many cores other processes keep busy, and the threads left for decoding."""
import subprocess
import sys
import time

import pytest

from b2b import cpu_load
from b2b.cpu_load import CoreLoad

linux = pytest.mark.skipif(cpu_load._busy_seconds() is None, reason="needs Linux's /proc/stat")


@linux
def test_a_busy_process_is_counted_and_this_one_is_not():
    load = CoreLoad()
    assert load.others() is None  # the first look has nothing to compare with
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(1.0)
        load.others()
        time.sleep(1.0)
        assert load.others() > 0.5  # the spinning child, about one core
    finally:
        spin.kill()
        spin.wait()
    load.others()
    start = time.process_time()
    while time.process_time() - start < 0.5:  # this process's own work is not "others"
        pass
    assert load.others() < 0.5


@pytest.mark.parametrize("cores, others, threads", [
    (2, 0.1, 0),  # nothing taken: the C step's default, every core
    (2, 0.9, 1),
    (2, 2.0, 1),  # all taken: still one thread
    (16, 2.2, 14),
])
def test_threads_are_the_cores_left_free(monkeypatch, cores, others, threads):
    load = CoreLoad()
    monkeypatch.setattr(cpu_load, "usable_cores", lambda: cores)
    monkeypatch.setattr(load, "others", lambda: others)
    assert load.threads() == threads


def test_without_a_reading_the_last_answer_stands(monkeypatch):
    load = CoreLoad()
    monkeypatch.setattr(cpu_load, "usable_cores", lambda: 2)
    readings = iter([1.0, None])
    monkeypatch.setattr(load, "others", lambda: next(readings))
    assert load.threads() == 1 and load.threads() == 1
    monkeypatch.setattr(cpu_load, "_busy_seconds", lambda: None)  # no /proc/stat: nothing known
    assert CoreLoad().threads() == 0
