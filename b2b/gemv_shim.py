"""Builds and installs gemv_shim.c (see its header): a `cblas_sgemm` in front of OpenBLAS that
sends products of at most 4 rows (greedy and beam-4 decoding steps) to `cblas_sgemv`.

Imported by `runtime` before `mlx.core` is loaded. Compiled once per source version with the
system C compiler (MLX's CPU backend needs one at run time anyway) into a folder only this
user can write; anything that goes wrong leaves b2b on plain OpenBLAS.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_shim.c")
MAX_ROWS = 4  # a greedy step has 1 row, beam 4 has 4 (beam-4 steps measured as fast or faster up to 4)
_OFF = ("0", "false", "no", "off")


def _private_folder(folder: str) -> bool:
    """Create `folder` (mode 0700) if needed; True when it is ours and nobody else can write it
    (a shared /tmp folder someone else made could hold a planted library)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _folders() -> list[str]:
    home = os.path.expanduser("~")  # stays "~" when there is no home directory
    cache = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else "")
    private_tmp = os.path.join(tempfile.gettempdir(), f"b2b-{os.getuid()}")
    return [os.path.join(cache, "b2b"), private_tmp] if cache else [private_tmp]


def enabled() -> bool:
    """False when the environment sets B2B_GEMV_SHIM to 0 / false / no / off."""
    return os.environ.get("B2B_GEMV_SHIM", "1").lower() not in _OFF


def library_name() -> str:
    """The build's file name: one per source version and machine type."""
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return f"gemv_shim-{digest}-{platform.machine()}.so"


def build() -> str | None:
    """Path of the compiled shim (built now if this source version has no build yet), or None."""
    name = library_name()
    for folder in _folders():
        if not _private_folder(folder):
            continue
        out = os.path.join(folder, name)
        if os.path.exists(out):
            return out
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            return None
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", SOURCE, "-o", tmp], check=True, capture_output=True, timeout=60)
            os.replace(tmp, out)  # atomic: a concurrent build of the same source writes the same file
            return out
        except (OSError, subprocess.SubprocessError) as e:
            log.debug("Could not build the gemv shim: %s", e)
            return None  # a compiler that fails here fails in every folder
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return None


def install(blas: ctypes.CDLL) -> bool:
    """Put the shim's cblas_sgemm in front of `blas` (an OpenBLAS still loaded locally; the
    caller makes it global afterwards). True only when the global cblas_sgemm is now the
    shim's. B2B_GEMV_SHIM=0 turns it off."""
    if not enabled():
        return False
    try:
        real = [ctypes.cast(getattr(blas, f), ctypes.c_void_p).value for f in ("cblas_sgemm", "cblas_sgemv")]
        path = build()
        if path is None:
            return False
        shim = ctypes.CDLL(path)  # local until it is initialised: an uninitialised shim aborts
        shim.b2b_gemv_shim_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        shim.b2b_gemv_shim_init(*real, MAX_ROWS)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # promoted: global, ahead of the BLAS
        ours = ctypes.cast(shim.cblas_sgemm, ctypes.c_void_p).value
        return ctypes.cast(ctypes.CDLL(None).cblas_sgemm, ctypes.c_void_p).value == ours
    except (OSError, AttributeError) as e:
        log.debug("gemv shim not used: %s", e)
        return False
