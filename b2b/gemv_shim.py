"""Builds and installs gemv_shim.c (see its header): a `cblas_sgemm` in front of OpenBLAS that
sends products of at most 4 rows (greedy and beam-4 decoding steps) to `cblas_sgemv`.

Imported by `runtime` before `mlx.core` is loaded. Compiled once per source version by `native`;
anything that goes wrong leaves b2b on plain OpenBLAS.
"""
from __future__ import annotations

import ctypes
import logging
import os

from . import native

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_shim.c")
MAX_ROWS = 4  # a greedy step has 1 row, beam 4 has 4 (beam-4 steps measured as fast or faster up to 4)
_OFF = ("0", "false", "no", "off")
_FLAGS = ("-O2",)


def enabled() -> bool:
    """False when the environment sets B2B_GEMV_SHIM to 0 / false / no / off."""
    return os.environ.get("B2B_GEMV_SHIM", "1").lower() not in _OFF


def library_name() -> str:
    """The build's file name: one per source version and machine type."""
    return native.library_name(SOURCE, _FLAGS)


def build() -> str | None:
    """Path of the compiled shim (built now if this source version has no build yet), or None."""
    return native.build(SOURCE, _FLAGS)


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
