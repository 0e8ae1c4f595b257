"""Process-level set-up that must happen before `mlx.core` is imported.

The Linux `mlx[cpu]` wheel links a reference BLAS (~5 GFLOP/s on a 4096x256x30522 matmul).
Loading an optimized BLAS that exports `cblas_sgemm` with RTLD_GLOBAL *before* MLX is
imported makes the dynamic linker resolve MLX's BLAS calls to it (~200 GFLOP/s measured).
With OpenBLAS, a small `cblas_sgemm` shim (gemv_shim.c, compiled once with the system C
compiler) goes in front of it so that one-row products (decoding steps) skip sgemm's packing.
This module is imported first by `b2b/__init__.py`, so `import b2b` is enough.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile

log = logging.getLogger(__name__)

_BLAS: dict = {"name": "unknown", "path": None, "gemv_shim": False}
_SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemv_shim.c")
_SHIM_MAX_ROWS = 4  # a greedy step has 1 row, beam 4 has 4 (beam-4 steps measured faster up to 4)


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
        try:
            lib = ctypes.CDLL(path)  # local first: only a library with cblas_sgemm is made global
            lib.cblas_sgemm  # noqa: B018 - raises AttributeError when the symbol is absent
        except (OSError, AttributeError):
            continue
        if name == "openblas":
            _BLAS["gemv_shim"] = _install_gemv_shim(lib)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # promoted to the global scope, after the shim
        _BLAS.update(name=name, path=os.path.realpath(path))
        return
    _BLAS.update(name="mlx-builtin (reference BLAS, slow)", path=None)
    log.warning(
        "No optimized BLAS found: MLX on the CPU will be ~40x slower at matrix products. "
        "Install one with `sudo apt-get install libopenblas0-pthread` (Debian/Ubuntu) "
        "or `pip install mkl`, then restart."
    )


def _build_gemv_shim() -> str | None:
    """Compile gemv_shim.c once per source version (MLX's CPU backend already needs a C++
    compiler at run time for mx.compile) into ~/.cache/b2b; None when that is not possible."""
    with open(_SHIM_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    name = f"gemv_shim-{digest}-{platform.machine()}.so"
    home = os.path.expanduser("~")  # stays "~" when there is no home directory
    cache = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else tempfile.gettempdir())
    for folder in (os.path.join(cache, "b2b"), os.path.join(tempfile.gettempdir(), "b2b")):
        out = os.path.join(folder, name)
        if os.path.exists(out):
            return out
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not compiler:
            return None
        try:
            os.makedirs(folder, exist_ok=True)
            tmp = f"{out}.{os.getpid()}.tmp"  # renamed into place: concurrent builds cannot clash
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", _SHIM_SOURCE, "-o", tmp],
                           check=True, capture_output=True, timeout=120)
            os.replace(tmp, out)
            for old in glob.glob(os.path.join(folder, "gemv_shim-*.so")):  # earlier versions' builds
                if old != out:
                    os.remove(old)
            return out
        except (OSError, subprocess.SubprocessError) as e:
            log.debug("Could not build the gemv shim in %s: %s", folder, e)
    return None


def _install_gemv_shim(blas: ctypes.CDLL) -> bool:
    """Put gemv_shim's cblas_sgemm in front of `blas` (still loaded locally): products of at
    most 4 rows (a greedy or beam-4 decoding step) then skip OpenBLAS's packing of the weight
    matrix (greedy steps measured ~1.6x faster). B2B_GEMV_SHIM=0 turns it off."""
    if os.environ.get("B2B_GEMV_SHIM", "1") == "0":
        return False
    try:
        sgemm, sgemv = (ctypes.cast(getattr(blas, f), ctypes.c_void_p).value for f in ("cblas_sgemm", "cblas_sgemv"))
        path = _build_gemv_shim()
        if path is None:
            return False
        shim = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        shim.b2b_gemv_shim_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        shim.b2b_gemv_shim_init(sgemm, sgemv, _SHIM_MAX_ROWS)  # before anything can call it
        return True
    except (OSError, AttributeError) as e:
        log.debug("gemv shim not used: %s", e)
        return False


_load_fast_blas()


def runtime_info() -> dict:
    """MLX version, device, BLAS in use and platform, for logs and the demo's model_info."""
    import mlx.core as mx

    return {
        "mlx": mx.__version__,
        "device": str(mx.default_device()),
        "metal": bool(mx.metal.is_available()) if hasattr(mx, "metal") else False,
        "blas": _BLAS["name"],
        "blas_path": _BLAS["path"],
        "gemv_shim": _BLAS["gemv_shim"],
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
