"""Makes sure OpenBLAS runs the matrix kernels this CPU can run.

A DYNAMIC_ARCH OpenBLAS picks its kernels ("core type") from the CPU model at load time. An
OpenBLAS older than the CPU does not know the model and falls back to generic SSE3 kernels
("Prescott"): Debian 12's OpenBLAS 0.3.21 does this on recent Xeons, where a 4096x256x30522
product measured 60 GFLOP/s instead of 200 with the AVX-512 kernels. OpenBLAS reads the core
type from `OPENBLAS_CORETYPE` when it is set, so before loading it we ask it, in a child
process (its choice is made once, at load), which core it would pick; when that core uses
narrower vectors than the CPU's flags allow, we set the variable to the widest kernel family
the flags support. A user's own OPENBLAS_CORETYPE is always kept. The answer is cached per
library and CPU, so the child process runs once.

Imported by `runtime` before `mlx.core` is loaded: standard library only.
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

from . import native

log = logging.getLogger(__name__)

ENV = "OPENBLAS_CORETYPE"

# Kernel families by vector width, widest first: (core type to force, CPU flags it needs).
_FAMILIES = (
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Haswell", {"avx2", "fma"}),
    ("Sandybridge", {"avx"}),
)
_TIER = {name: len(_FAMILIES) - i for i, (name, _) in enumerate(_FAMILIES)}  # SkylakeX 3 ... Sandybridge 1
# OpenBLAS core names (lower case) and the family whose vector width their kernels use; a name
# not listed here (a newer OpenBLAS's) is trusted as it is.
_CORE_TIER = {
    **{n: 3 for n in ("skylakex", "cooperlake", "sapphirerapids")},
    **{n: 2 for n in ("haswell", "zen", "excavator", "steamroller")},
    **{n: 1 for n in ("sandybridge", "bulldozer", "piledriver")},
    **{n: 0 for n in ("unknown", "katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2",
                      "penryn", "dunnington", "nehalem", "athlon", "opteron", "opteron(sse3)", "barcelona",
                      "nano", "bobcat")},
}

_PROBE = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "lib.openblas_get_corename.restype = ctypes.c_char_p\n"
    "print(lib.openblas_get_corename().decode())\n"
)


def _cpu_flags() -> set[str]:
    line = native._cpu_flags().decode(errors="replace")
    return set(line.partition(":")[2].split())


def best_family(flags: set[str]) -> str | None:
    """The widest OpenBLAS kernel family the CPU flags allow (None: none of ours applies)."""
    return next((name for name, needs in _FAMILIES if needs <= flags), None)


def needs_override(detected: str, flags: set[str]) -> str | None:
    """The core type to force when OpenBLAS's own pick (`detected`) uses narrower vectors than
    `flags` allow, else None."""
    best = best_family(flags)
    tier = _CORE_TIER.get(detected.strip().lower())
    if best is None or tier is None or tier >= _TIER[best]:
        return None
    return best


def _probe(path: str) -> str | None:
    """The core type OpenBLAS at `path` picks on its own here, asked in a child process."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["OPENBLAS_NUM_THREADS"] = "1"  # no thread pool needed to answer
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, path], env=env, capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("Could not ask %s for its core type: %s", path, e)
        return None
    return out or None


def _cache_name(path: str) -> str:
    real = os.path.realpath(path)
    digest = hashlib.sha256(real.encode())
    try:
        st = os.stat(real)
        digest.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    except OSError:
        pass
    digest.update(native._cpu_flags())
    return f"openblas-core-{digest.hexdigest()[:12]}.txt"


def detected_core(path: str) -> str | None:
    """OpenBLAS's own core-type pick for this library on this CPU (cached; a probe that got no
    answer is cached too, as an empty file, so that it is not retried at every start)."""
    name = _cache_name(path)
    folders = [f for f in native._folders() if native._private_folder(f)]
    for folder in folders:
        try:
            with open(os.path.join(folder, name)) as f:
                return f.read().strip() or None
        except OSError:
            continue
    core = _probe(path)
    if folders:
        try:  # written whole, then renamed: a process starting beside us never reads half of it
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folders[0])
            with os.fdopen(fd, "w") as f:
                f.write((core or "") + "\n")
            os.replace(tmp, os.path.join(folders[0], name))
        except OSError:
            pass
    return core


def choose(path: str) -> str | None:
    """The core type to set in OPENBLAS_CORETYPE while OpenBLAS at `path` loads, when its own
    pick would leave this CPU's vector units half idle; None: nothing to set (also when the user
    set the variable, or `B2B_OPENBLAS_CORETYPE=0`)."""
    if os.environ.get(ENV) or os.environ.get("B2B_OPENBLAS_CORETYPE") == "0":
        return None
    if getattr(sys, "frozen", False):
        return None  # a bundled app: sys.executable is the app, not a Python to ask
    flags = _cpu_flags()
    if best_family(flags) is None:
        return None  # nothing to gain (or not x86): skip the child process
    detected = detected_core(path)
    forced = needs_override(detected, flags) if detected else None
    if forced:
        log.info("OpenBLAS would use its %s kernels on this CPU, which supports %s: loading it with %s=%s.",
                 detected, forced, ENV, forced)
    return forced


@contextmanager
def coretype(value: str | None) -> Iterator[None]:
    """OPENBLAS_CORETYPE=value inside the block (OpenBLAS reads it once, when it loads), the
    previous environment after it: other OpenBLAS copies (NumPy's) and child processes keep
    their own pick."""
    if value is None:
        yield
        return
    os.environ[ENV] = value
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
