"""Process-level set-up that must happen before `mlx.core` is imported.

The Linux `mlx[cpu]` wheel links a reference BLAS (~5 GFLOP/s on a 4096x256x30522 matmul).
Loading an optimized BLAS that exports `cblas_sgemm` with RTLD_GLOBAL *before* MLX is
imported makes the dynamic linker resolve MLX's BLAS calls to it (~200 GFLOP/s measured).
With OpenBLAS, a small `cblas_sgemm` shim (gemv_shim.c, compiled once with the system C
compiler) goes in front of it so that one-row products (decoding steps) skip sgemm's packing.
An OpenBLAS that does not know the CPU model would run generic SSE3 kernels: `openblas_core`
chooses its kernel family first. This module is imported first by `b2b/__init__.py`, so
`import b2b` is enough.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import platform
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from . import gemv_shim, openblas_core

log = logging.getLogger(__name__)

_BLAS: dict = {"name": "unknown", "path": None, "gemv_shim": False, "lib": None, "core": None, "core_forced": None}


def _linux_candidates() -> list[tuple[str, str]]:
    """(name, path) pairs to try, best first: OpenBLAS measured faster than MKL on AMD here."""
    found: list[tuple[str, str]] = []
    override = os.environ.get("B2B_BLAS")
    if override:
        found.append(("B2B_BLAS", override))
    for pattern in (
        "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/*-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
    ):
        found += [("openblas", p) for p in sorted(glob.glob(pattern))]
    lib = ctypes.util.find_library("openblas")
    if lib:
        found.append(("openblas", lib))
    # The `mkl` wheel installs libmkl_rt into <prefix>/lib of the environment.
    for prefix in {sys.prefix, sys.base_prefix}:
        found += [("mkl", p) for p in sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))]
    return found


def _load_fast_blas() -> None:
    if "mlx.core" in sys.modules:
        _BLAS.update(name="unknown (mlx.core was imported before b2b)", path=None)
        log.warning("mlx.core was imported before b2b: the fast BLAS could not be preloaded.")
        return
    if platform.system() == "Darwin":
        _BLAS.update(name="accelerate", path=None)  # MLX uses Accelerate / Metal on macOS
        return
    if platform.system() != "Linux":
        _BLAS.update(name="mlx-builtin", path=None)
        return
    if os.environ.get("B2B_BLAS", "").lower() == "none":
        _BLAS.update(name="mlx-builtin (B2B_BLAS=none)", path=None)
        return
    for name, path in _linux_candidates():
        # Before the load: OpenBLAS picks its kernels once, when it is loaded.
        forced = openblas_core.choose(path) if "openblas" in os.path.basename(path).lower() else None
        try:
            with openblas_core.coretype(forced):
                lib = ctypes.CDLL(path)  # local first: only a library with cblas_sgemm is made global
            lib.cblas_sgemm  # noqa: B018 - raises AttributeError when the symbol is absent
        except (OSError, AttributeError):
            continue
        if hasattr(lib, "openblas_get_config"):  # OpenBLAS, also when named by B2B_BLAS
            _BLAS["gemv_shim"] = gemv_shim.install(lib)
            corename = getattr(lib, "openblas_get_corename", None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                _BLAS["core"] = corename().decode(errors="replace")
            _BLAS["core_forced"] = forced
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # promoted to the global scope, after the shim
        _BLAS.update(name=name, path=os.path.realpath(path), lib=lib)
        return
    _BLAS.update(name="mlx-builtin (reference BLAS, slow)", path=None)
    log.warning(
        "No optimized BLAS found: MLX on the CPU will be ~40x slower at matrix products. "
        "Install one with `sudo apt-get install libopenblas0-pthread` (Debian/Ubuntu) "
        "or `pip install mkl`, then restart."
    )


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def tune_malloc() -> bool:
    """Keep freed memory in glibc's heap instead of returning it to the kernel: MLX on the CPU
    allocates every activation afresh, and by default each large buffer is a new mmap whose
    pages fault in again at every training step. One arena for all threads, buffers up to 32 MB
    (glibc's limit) from the heap, no trimming. Called when b2b is imported, before MLX and the
    BLAS start their threads: a thread keeps the arena it first allocated from, and a second
    arena is made of 64 MB heaps that glibc maps and unmaps whole (called only from the first
    training step, ~200 k page faults and ~0.6 s of kernel time a minilm fine-tuning step
    remained). Process-wide; Linux/glibc only (B2B_TUNE_MALLOC=0: off); returns whether it
    applied."""
    if platform.system() != "Linux" or os.environ.get("B2B_TUNE_MALLOC", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        # (A 256 MB top pad measured no faster and ~150 MB more peak memory: none.)
        settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 2**31 - 1))
        return all(libc.mallopt(ctypes.c_int(k), ctypes.c_int(v)) == 1 for k, v in settings)
    except (OSError, AttributeError):  # not glibc (musl): nothing to tune
        return False


tune_malloc()  # first: before any library starts a thread
_load_fast_blas()


def usable_cores() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _blas_threads(n: int | None = None) -> int | None:
    """The preloaded BLAS's thread count, set to `n` first when given; None when unknown."""
    lib = _BLAS["lib"]
    # (MKL's lowercase names are Fortran-style, taking pointers: its C-style names take ints.)
    for get, set_ in (("openblas_get_num_threads", "openblas_set_num_threads"), ("MKL_Get_Max_Threads", "MKL_Set_Num_Threads")):
        if lib is not None and hasattr(lib, get):
            if n is not None:
                getattr(lib, set_)(ctypes.c_int(n))
            return int(getattr(lib, get)())
    return None


_threads_lock = threading.Lock()


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Hold the BLAS and b2b's attention kernel to `n` threads each inside the block, for
    callers that run several MLX CPU streams at once (one thread each keeps the cores from
    being oversubscribed). Both are process-wide: on leaving, the BLAS gets its previous count
    back and the kernel its default (one thread per core). Not re-entrant."""
    from . import cpu_ops  # imports mlx: only once mlx.core may load

    with _threads_lock:
        before = _blas_threads()
        _blas_threads(n)
        cpu_ops.set_threads(n)
        try:
            yield
        finally:
            if before is not None:
                _blas_threads(before)
            cpu_ops.set_threads(0)


def _device_name(mx) -> str | None:
    """The default device's name as MLX reports it, or None where this MLX cannot say."""
    try:
        return str(mx.device_info().get("device_name") or "") or None
    except (AttributeError, RuntimeError):  # older MLX, or a backend without device_info
        return None


def runtime_info() -> dict:
    """MLX version, device, BLAS in use, whether decoding steps and attention run in C, and
    platform, for logs and the demo's model_info."""
    import mlx.core as mx

    from . import cpu_ops, cpu_step  # import mlx: only once mlx.core may load

    return {
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "device_name": _device_name(mx),  # "NVIDIA H200", "Apple M2 Max", the CPU's model
        "metal": bool(mx.metal.is_available()) if hasattr(mx, "metal") else False,
        "blas": _BLAS["name"],
        "blas_path": _BLAS["path"],
        "blas_core": _BLAS["core"],  # OpenBLAS's kernel family (e.g. SkylakeX, Haswell)
        "blas_core_forced": _BLAS["core_forced"],  # set by b2b: OpenBLAS did not know this CPU
        "gemv_shim": _BLAS["gemv_shim"],
        "cpu_step": cpu_step.available(),
        "cpu_attention": cpu_ops.enabled(),
        "cpu_layernorm": cpu_ops.enabled("layernorm"),
        "cpu_gelu": cpu_ops.enabled("gelu"),
        "cpu_dropout": cpu_ops.enabled("dropout"),
        "cpu_vocab_loss": cpu_ops.enabled("vocab_loss"),
        "cpu_adamw": cpu_ops.enabled("adamw"),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
