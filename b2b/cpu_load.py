"""How many cores other processes keep busy, so the C decoding step can leave them alone.

The C step (cpu_step.c) runs a team of OpenMP threads that meet at a barrier several times a
step. When another process (a training run beside the app, an evaluation) keeps a core busy,
the team thread on that core waits for a scheduler time slice at every barrier: on 2 cores
beside one busy process, beam-4 decoding took 2.3-2.5 s an article with 2 threads against
~1.0 s with 1 (`python -m bench.article_speed demo/checkpoint --articles 10 --beams 1,4`;
idle, 2 threads are the faster: 0.48 against 0.75-1.0 s). So each decoding asks `threads()`.

Linux only (/proc/stat); elsewhere, and on the first call, it says 0: the C step's default."""
from __future__ import annotations

import os
import threading
import time

from .runtime import usable_cores

_MIN_WINDOW = 0.2  # seconds: a shorter window since the last look reuses the last answer
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (not idle, iowait)


def _busy_seconds() -> float | None:
    """CPU seconds all processes have used since boot, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        return sum(int(fields[i]) for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CoreLoad:
    """Cores used by other processes since the previous call, from /proc/stat and this
    process's own CPU time (`time.process_time`, all its threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[float, float, float] | None = None  # (wall, all busy, own)
        self._answer = 0

    def others(self) -> float | None:
        """Cores other processes kept busy, on average, since the previous call; None on the
        first call, when /proc/stat is missing, or after less than `_MIN_WINDOW` seconds."""
        busy = _busy_seconds()
        if busy is None:
            return None
        now, own = time.monotonic(), time.process_time()
        with self._lock:
            last = self._last
            if last is not None and now - last[0] < _MIN_WINDOW:
                return None
            self._last = (now, busy, own)
        if last is None:
            return None
        return max(0.0, ((busy - last[1]) - (own - last[2])) / (now - last[0]))

    def threads(self) -> int:
        """Threads for the next decoding: the cores others leave free (at least 1), or 0 (the C
        step's own default, all cores) when nothing is known or no core is taken."""
        others = self.others()
        with self._lock:
            if others is not None:
                taken = int(others + 0.5)  # half a core busy counts as taken
                self._answer = 0 if taken == 0 else max(1, usable_cores() - taken)
            return self._answer
