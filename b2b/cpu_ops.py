"""b2b's C kernels for MLX's CPU backend as MLX primitives, in a small C++ extension
(ext/ops.cpp): fused softmax attention, forward and backward (cpu_attention.c), LayerNorm,
forward and backward (cpu_layernorm.c), exact-erf GELU (cpu_gelu.c), dropout (cpu_dropout.c),
the vocabulary projection with its cross-entropy (cpu_vocab_loss.c) and one AdamW update
(cpu_adamw.c); see their headers for why.

Being MLX primitives, they run inside MLX's graph like any op: under `mx.compile` and
`value_and_grad`, so training uses them as well as inference. The model's four (attention,
LayerNorm, GELU, dropout) also take `mx.vmap` and `mx.jvp` (attention's and LayerNorm's
forward mode in MLX ops, not a kernel: it is rare).
`attention(q, k, v, mask)` (scaled q) returns None where it does not apply, and `fastmath` then computes the same thing
with MLX ops. It applies on the CPU device (a GPU has MLX's own fast kernels) to float32, a
head size that is a multiple of 16 and a key-padding mask, "causal" or no mask; off with
B2B_CPU_ATTENTION=0. The others likewise return None where they do not apply: `layer_norm`
(float32, with weight and bias; off with B2B_CPU_LAYERNORM=0), `vocab_loss` (float32, with the
BLAS's cblas_sgemm; B2B_CPU_VOCAB_LOSS=0), `adamw` and `sum_squares` (float32;
B2B_CPU_ADAMW=0), `gelu` and `dropout` (float32; B2B_CPU_GELU=0, B2B_CPU_DROPOUT=0).
`set_threads` caps the attention kernel's threads (train/step.py).

The extension is built once per source version, MLX and Python version and machine into
b2b's private cache folder (native.py), with CMake, nanobind (the version MLX itself was
built with: its arrays must cross) and a C++ compiler; `main()` builds it ahead
(setup.sh runs it), and the first use builds it otherwise (~30 s). Without those tools MLX's
attention is used and `runtime_info()` says so.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import lru_cache

import mlx.core as mx

from . import native

log = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, *f) for f in (("ext", "ops.cpp"), ("ext", "CMakeLists.txt"), ("cpu_attention.c",),
                                                   ("cpu_layernorm.c",), ("cpu_vocab_loss.c",), ("cpu_vec.h",),
                                                   ("cpu_adamw.c",), ("cpu_gelu.c",), ("cpu_dropout.c",), ("cpu_par.h",)))
MODULE = "_b2b_ops"


def _cmake() -> str | None:
    """cmake beside this Python (setup.sh installs the `cmake` wheel when the system has none
    recent enough), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "cmake")
    return beside if os.access(beside, os.X_OK) else shutil.which("cmake")


def _make(path: str) -> None:
    """Configure and build the extension with CMake; copy the module to `path`."""
    import mlx
    import nanobind  # a build requirement only (requirements.txt)

    cmake = _cmake()
    if cmake is None:
        raise OSError("cmake not found")
    with tempfile.TemporaryDirectory(prefix="b2b-ops-") as build:
        configure = [cmake, "-S", os.path.dirname(SOURCES[0]), "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DMLX_DIR={os.path.join(mlx.__path__[0], 'share', 'cmake', 'MLX')}",
                     f"-Dnanobind_DIR={nanobind.cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}"]
        for cmd in (configure, [cmake, "--build", build, "-j", str(os.cpu_count() or 2)]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode:
                raise subprocess.SubprocessError(f"{' '.join(cmd[:2])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        built = [f for f in os.listdir(build) if f.startswith(MODULE) and f.endswith(".so")]
        if not built:
            raise subprocess.SubprocessError("the build made no module")
        shutil.copyfile(os.path.join(build, built[0]), path)


def build(retry: bool = False) -> str | None:
    """Path of the built extension (building it now if this version has none yet), or None;
    `retry`: try again even after a failed build (see native.cached)."""
    key = (mx.__version__, sys.version.split()[0], sysconfig.get_config_var("EXT_SUFFIX") or "", "-march=native")
    return native.cached(native.library_name(SOURCES[0], key, SOURCES[1:]), _make, retry)


@lru_cache(maxsize=1)
def _module():
    """The extension module, or None (and why, in the log) when it cannot be built or loaded."""
    try:
        path = build()
        if path is None:
            log.info("b2b's CPU kernels not built (needs cmake, nanobind and a C++ compiler): MLX ops are used.")
            return None
        loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
        spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        # MLX's arrays cross only with a nanobind of the same ABI as MLX's own: a call (not
        # evaluated: this may run inside an mx.compile trace) raises TypeError otherwise.
        x = mx.zeros((1, 1, 2, 16))
        module.attention(x, x, x, None, True)
        sgemm = _sgemm_address()
        if sgemm:  # (vocab_loss: enabled() checks for it)
            module.set_sgemm(sgemm)
        return module
    except Exception as e:  # ImportError, OSError, or TypeError from a nanobind ABI mismatch
        log.info("b2b's CPU kernels not used: %s", e)
        return None


@lru_cache(maxsize=1)
def _sgemm_address() -> int | None:
    """Where cblas_sgemm is: in the BLAS b2b loaded (runtime.py), else anywhere in the process
    (macOS: Accelerate, which MLX links); None without one, or when it fails a 2 x 2 product
    (e.g. a BLAS with 64-bit integers)."""
    from . import runtime

    try:
        libs = [runtime._BLAS.get("lib"), ctypes.CDLL(None)]
    except OSError:
        libs = [runtime._BLAS.get("lib")]
    for lib in libs:
        fn = getattr(lib, "cblas_sgemm", None) if lib is not None else None
        if fn is not None and _sgemm_works(fn):
            return ctypes.cast(fn, ctypes.c_void_p).value
    return None


def _sgemm_works(fn) -> bool:
    """[[1, 2], [3, 4]] squared through `fn` (row-major CBLAS, 32-bit integers)."""
    a = (ctypes.c_float * 4)(1, 2, 3, 4)
    c = (ctypes.c_float * 4)()
    fn.restype = None
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    try:
        fn(101, 111, 111, 2, 2, 2, 1.0, a, 2, a, 2, 0.0, c, 2)
    except Exception:  # noqa: BLE001 - any failure: not used
        return False
    return list(c) == [7.0, 10.0, 15.0, 22.0]


def enabled(kernel: str = "attention") -> bool:
    """Whether a kernel ("attention", "layernorm", "gelu", "dropout", "vocab_loss" or "adamw") runs: its
    B2B_CPU_<KERNEL> not 0, MLX on the CPU and the extension built (and, for vocab_loss, a
    BLAS with cblas_sgemm found)."""
    off = os.environ.get(f"B2B_CPU_{kernel.upper()}", "1").lower() in ("0", "false", "no", "off")
    if off or mx.default_device() != mx.cpu or _module() is None:
        return False
    return kernel != "vocab_loss" or _sgemm_address() is not None


def attention(q: mx.array, k: mx.array, v: mx.array, mask) -> mx.array | None:
    """Softmax attention of scaled q (B, H, Tq, D) over k, v (B, H, Tk, D) with a mask as
    `fastmath.attention` takes it, or None when the kernel does not take these inputs."""
    if not (q.ndim == k.ndim == v.ndim == 4 and q.dtype == k.dtype == v.dtype == mx.float32 and q.shape[-1] % 16 == 0
            and k.shape == v.shape and q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3]):
        return None  # (no broadcasting over batch or heads)
    B, Tk = q.shape[0], k.shape[2]
    if mask is None or isinstance(mask, str):
        if mask not in (None, "causal"):
            return None
        key_mask, causal = None, mask == "causal"
    elif mask.ndim == 4 and mask.shape[1:3] == (1, 1) and mask.shape[0] in (1, B) and mask.shape[3] == Tk:
        key_mask, causal = mask.reshape(mask.shape[0], Tk), False
    else:
        return None  # e.g. a full (Tq, Tk) mask: MLX handles it
    if not enabled():
        return None
    return _module().attention(q, k, v, key_mask, causal)


def layer_norm(x: mx.array, weight: mx.array, bias: mx.array, eps: float) -> mx.array | None:
    """LayerNorm of float32 x (..., C) over its last axis, or None when the kernel does not
    take these inputs."""
    if not (x.dtype == weight.dtype == bias.dtype == mx.float32 and x.ndim >= 1 and weight.shape == bias.shape == x.shape[-1:]):
        return None
    if not enabled("layernorm"):
        return None
    return _module().layer_norm(x, weight, bias, float(eps))


def gelu(x: mx.array) -> mx.array | None:
    """GELU of float32 x (fastmath's erf form), differentiable, or None when the kernel does not
    take it."""
    if x.dtype != mx.float32 or not enabled("gelu"):
        return None
    return _module().gelu(x)


def dropout(x: mx.array, p: float) -> mx.array | None:
    """Training-mode dropout of float32 x: each element zeroed with probability `p` (rounded to
    a multiple of 2^-32), the others scaled to keep the expectation; a mask drawn from MLX's
    random state (mx.random.seed repeats it), differentiable. None when the kernel does not take
    x."""
    if x.dtype != mx.float32 or not 0.0 < p < 1.0 or not enabled("dropout"):
        return None
    seed = mx.random.randint(0, 2**31 - 1, (2,)).astype(mx.uint32)
    return _module().dropout(x, seed, float(1.0 - p))


def vocab_loss(h: mx.array, weight: mx.array, bias: mx.array, labels: mx.array, weights: mx.array,
               label_smoothing: float = 0.0) -> mx.array | None:
    """Per-row cross-entropy of the logits h @ weight.T + bias (h (N, C), weight (V, C), bias
    (V,)) against integer labels (N,), label-smoothed as train/losses.py defines it, without
    materialising the logits' softmax: (N,), 0 where `weights` (N,) is 0 (those rows are not
    computed). Differentiable in h, weight and bias. None when the kernel does not take these
    inputs."""
    if not (h.ndim == 2 and weight.ndim == 2 and h.shape[1] == weight.shape[1] and bias.shape == weight.shape[:1]
            and labels.shape == weights.shape == h.shape[:1] and mx.issubdtype(labels.dtype, mx.integer)
            and h.dtype == weight.dtype == bias.dtype == mx.float32):
        return None
    if not enabled("vocab_loss"):
        return None
    return _module().vocab_loss(h, weight, bias, labels, weights, float(label_smoothing))


def adamw(p: mx.array, g: mx.array, m: mx.array, v: mx.array, coef: mx.array,
          hyper: tuple[float, ...]) -> tuple[mx.array, mx.array, mx.array] | None:
    """One AdamW update of float32 parameter p with gradient g and moments m, v (cpu_adamw.c
    has the formula): the new (p, m, v). coef: (scale, decay, c1, c2) as a float32 array; hyper:
    (b1, 1 - b1, b2, 1 - b2, eps). None when the kernel does not take these inputs."""
    if not (p.dtype == g.dtype == m.dtype == v.dtype == mx.float32 and p.shape == g.shape == m.shape == v.shape):
        return None
    if not enabled("adamw"):
        return None
    return tuple(_module().adamw(p, g, m, v, coef, [float(x) for x in hyper]))


def sum_squares(arrays: list[mx.array]) -> mx.array | None:
    """The sum of squares of every element of float32 `arrays` (a float32 scalar; summed in
    double), or None when the kernel does not take them (off with B2B_CPU_ADAMW=0, as the
    update it serves)."""
    if not arrays or any(a.dtype != mx.float32 for a in arrays) or not enabled("adamw"):
        return None
    return _module().sum_squares(list(arrays))


def set_threads(n: int) -> None:
    """At most `n` threads per attention call (0: one per core); for callers that run several
    MLX CPU streams at once and want one thread each."""
    module = _module()
    if module is not None:
        module.set_threads(int(n))

def main() -> None:
    """Build now and say what happened (setup.sh runs this)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger(native.__name__).setLevel(logging.DEBUG)  # why a build failed, with its output
    try:
        path = build(retry=True)
    except ImportError as e:
        path = None
        log.info("%s", e)
    print(f"b2b's CPU kernels (attention, LayerNorm, GELU, dropout, vocabulary loss, AdamW): {path}" if path else "b2b's CPU kernels: not built; MLX ops will be used.")

