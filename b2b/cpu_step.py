"""Decoding steps in C on MLX's CPU backend (cpu_step.c; see its header for why).

`CpuStepper` is a drop-in for `generate._Stepper`'s compiled MLX step: the same inputs and
outputs (a host array of logits), one C call per token instead of ~600 MLX kernels. It reads
the model's float32 weights and the encoder's cross-attention values in place (numpy views of
MLX memory, nothing copied), float16 copies of the weight matrices where float16 holds their
values exactly, and the cross-attention keys transposed (one copy per input); it keeps the
self-attention cache in numpy. It is used only where it applies: the CPU device, float32
weights, eval mode, B2B_CPU_STEP not 0 (nor B2B_COMPILE_DECODE), and a C compiler with OpenMP
to build it; otherwise decoding stays on MLX, which computes the same step.
"""
from __future__ import annotations

import ctypes
import logging
import os
from functools import lru_cache

import mlx.core as mx
import numpy as np

from . import native
from .cpu_load import CoreLoad
from .model import Bert2Bert

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_step.c")
HEADERS = (os.path.join(os.path.dirname(SOURCE), "cpu_vec.h"),)
# -march=native: built on the machine that runs it (the build's name carries the CPU's flags).
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno")
_F32P = ctypes.POINTER(ctypes.c_float)
_OFF = ("0", "false", "no", "off")
_load = CoreLoad()


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built C step, or None."""
    path = native.build(SOURCE, _FLAGS, HEADERS)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        ptrs, ints = ctypes.POINTER(_F32P), ctypes.POINTER(ctypes.c_int)
        halves = ctypes.POINTER(ctypes.c_void_p)
        lib.b2b_decode_step.argtypes = [ints, ctypes.c_float, ptrs, halves, ctypes.c_int, ctypes.c_int, ints, ctypes.c_int,
                                        ptrs, ptrs, ptrs, ptrs, ctypes.c_int, ctypes.POINTER(ctypes.c_ubyte),
                                        ctypes.c_int, _F32P, _F32P]
        lib.b2b_decode_step.restype = ctypes.c_int
        lib.b2b_copy_mix.argtypes = [ctypes.c_int] * 6 + [_F32P] * 6 + [ctypes.c_float, ints, ints, ctypes.c_float, _F32P, _F32P]
        lib.b2b_copy_mix.restype = ctypes.c_int
        lib.b2b_reorder.argtypes = [ints, ctypes.c_int, ints, ctypes.c_int, ptrs, ptrs]
        lib.b2b_reorder.restype = ctypes.c_int
        lib.b2b_half_supported.restype = ctypes.c_int
        lib.b2b_to_half.argtypes = [_F32P, ctypes.c_void_p, ctypes.c_long]
        lib.b2b_to_half.restype = ctypes.c_int
        lib.b2b_step_set_threads.argtypes = [ctypes.c_int]
        return lib
    except (OSError, AttributeError) as e:
        log.debug("C decoding step not used: %s", e)
        return None


def available() -> bool:
    """Whether decoding steps can run in C here: MLX on the CPU (a GPU runs MLX's own kernels
    fast), B2B_CPU_STEP not 0, and the C step built. Independent of B2B_FAST_MATH: the C step
    uses its own exp and libm's erf."""
    if os.environ.get("B2B_CPU_STEP", "1").lower() in _OFF:
        return False
    return mx.default_device() == mx.cpu and _library() is not None


def applies(model: Bert2Bert) -> bool:
    """Whether decoding `model` runs its steps in C: `available()`, eval mode (the C step has
    no dropout) and float32 weights."""
    if model.training or not available():
        return False
    return all(p.dtype == mx.float32 for p in _weights(model))


def copy_mix(out: np.ndarray, h: np.ndarray, wq: np.ndarray, bq: np.ndarray, keys: np.ndarray, memory: np.ndarray,
             wg: np.ndarray, bg: float, slot: np.ndarray, tokens: np.ndarray, nothing_to_copy: float,
             weights: np.ndarray | None = None) -> bool:
    """The pointer-generator's mixing of one step in C (cpu_step.c's b2b_copy_mix; the
    arguments are pointer.CopyMixer's, all C-contiguous float32 / int32): `out` (R, V) is
    changed in place, and `weights` (R, S), when given, receives the copy weights. False, with
    nothing changed, where the C step is not available."""
    if not available():
        return False
    R, V = out.shape
    B, S, C = keys.shape
    if weights is not None and (weights.shape != (R, S) or weights.dtype != np.float32 or not weights.flags.c_contiguous):
        raise ValueError(f"The copy weights' buffer must be a C-contiguous float32 ({R}, {S}) array.")
    f = lambda a: a.ctypes.data_as(_F32P)  # noqa: E731
    i = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_int))  # noqa: E731
    status = _library().b2b_copy_mix(R, B, C, S, V, tokens.shape[1], f(h), f(wq), f(bq), f(keys), f(memory), f(wg),
                                     float(bg), i(slot), i(tokens), float(nothing_to_copy), f(out),
                                     None if weights is None else f(weights))
    if status == -2:
        raise MemoryError("Out of memory in a decoding step.")
    if status != 0:
        raise ValueError(f"Copy mixing got {R} rows for {B} inputs: rows must be a multiple of the inputs.")
    return True


def _as_f32(a: mx.array) -> np.ndarray:
    """A C-contiguous float32 numpy view of `a` (a copy only when `a` is not contiguous)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _weights(model: Bert2Bert) -> list[mx.array]:
    """The pointer table's arrays, in cpu_step.c's order (globals, then 22 per layer)."""
    emb, head = model._dec_embeddings(), model._dec_lm_head()
    table = [emb.word_table.weight, emb.position.weight, emb.token_type.weight[0], emb.norm.weight, emb.norm.bias,
             head.transform.weight, head.transform.bias, head.norm.weight, head.norm.bias, model.output_matrix(), head.bias]
    for layer, shared in zip(model.decoder.layers, model._shared_layers()):
        blocks = shared if shared is not None else layer
        sa, ca, ffn = blocks.self_attn, layer.cross_attn, blocks.ffn
        for lin in (sa.query, sa.key, sa.value, sa.out):
            table += [lin.weight, lin.bias]
        table += [blocks.self_attn_norm.weight, blocks.self_attn_norm.bias]
        for lin in (ca.query, ca.out):
            table += [lin.weight, lin.bias]
        table += [layer.cross_attn_norm.weight, layer.cross_attn_norm.bias]
        for lin in (ffn.up, ffn.down):
            table += [lin.weight, lin.bias]
        table += [blocks.ffn_norm.weight, blocks.ffn_norm.bias]
    return table


# Entries of the pointer table that are matrices of products (cpu_step.c's TRANSFORM_W and
# OUTPUT, then Q_W, K_W, V_W, O_W, CQ_W, CO_W, UP_W, DOWN_W of each 22-entry layer).
_GLOBALS, _PER_LAYER = 11, 22
_PRODUCTS = (5, 9)
_LAYER_PRODUCTS = (0, 2, 4, 6, 10, 12, 16, 18)
_HALF = "_b2b_half_copies"  # model.__dict__ key: (source arrays, copies), like generate's _OUTPUT_T


def _half_copies(model: Bert2Bert, sources: list[mx.array], arrays: list[np.ndarray]) -> list[np.ndarray | None]:
    """Float16 copies of the product matrices that float16 holds exactly (a checkpoint saved in
    float16, like the shipped one, loads as such float32 values), None elsewhere: the same
    products from half the bytes. Decoding streams every weight once a step from memory, so
    this makes steps faster and changes no result. Kept on the model while its weights are the
    same arrays (an update or a reload replaces them, and the copies are made afresh)."""
    layers = (len(arrays) - _GLOBALS) // _PER_LAYER
    wanted = sorted(set(_PRODUCTS) | {_GLOBALS + n * _PER_LAYER + i for n in range(layers) for i in _LAYER_PRODUCTS})
    key = [sources[i] for i in wanted]  # MLX arrays are immutable: the same objects, the same values
    held = model.__dict__.get(_HALF)
    if held is not None and len(held[0]) == len(key) and all(a is b for a, b in zip(held[0], key)):
        return held[1]
    copies: list[np.ndarray | None] = [None] * len(arrays)
    done: dict[int, np.ndarray | None] = {}  # by address: shared matrices (BERTShare, tied tables) once
    for i in wanted:
        a = arrays[i]
        if a.ctypes.data not in done:
            h = np.empty(a.shape, np.float16)
            exact = _library().b2b_to_half(a.ctypes.data_as(_F32P), h.ctypes.data, a.size)  # ~50x numpy's astype
            done[a.ctypes.data] = h if exact else None
        copies[i] = done[a.ctypes.data]
    model.__dict__[_HALF] = (key, copies)
    return copies


def half_enabled() -> bool:
    """Whether the C step may read float16 copies of weights (B2B_CPU_STEP_HALF=0: never)."""
    lib = _library()
    off = os.environ.get("B2B_CPU_STEP_HALF", "1").lower() in _OFF
    return not off and lib is not None and bool(lib.b2b_half_supported())


def _pointers(arrays: list[np.ndarray]):
    return (_F32P * len(arrays))(*(a.ctypes.data_as(_F32P) for a in arrays))


class CpuStepper:
    """Decoding steps in C for R = B * beams rows (row r reads input r // beams)."""

    def __init__(self, model: Bert2Bert, cross: list[tuple[mx.array, mx.array]], src_mask: mx.array | None,
                 capacity: int, beams: int, log_probs: bool):
        c = model.config
        self.lib = _library()
        self.log_probs = log_probs
        B, _, S, _ = cross[0][0].shape
        self.B, self.R, self.S, self.V, self.C = B, B * beams, S, c.vocab_size, c.hidden_size
        # Views of MLX memory: the MLX arrays are held too, so the memory stays alive.
        self._held = (_weights(model), cross)
        self._arrays = [_as_f32(a) for a in self._held[0]]
        self._table = _pointers(self._arrays)
        self._half = _half_copies(model, self._held[0], self._arrays) if half_enabled() else None
        self.half_matrices = sum(h is not None for h in self._half) if self._half else 0
        self._half_table = None if not self.half_matrices else (ctypes.c_void_p * len(self._half))(
            *(h.ctypes.data if h is not None else None for h in self._half))
        # Cross-attention keys transposed once per input, (B, H, D, S): a step's scores become
        # vector products over the keys.
        self._cross_k = [np.ascontiguousarray(np.asarray(k, dtype=np.float32).transpose(0, 1, 3, 2)) for k, _ in cross]
        self._cross_v = [_as_f32(v) for _, v in cross]
        self._ck, self._cv = _pointers(self._cross_k), _pointers(self._cross_v)
        shape = (self.R, c.num_heads, capacity, c.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in cross]
        self.values = [np.zeros(shape, np.float32) for _ in cross]
        self._k, self._v = _pointers(self.keys), _pointers(self.values)
        # (B, S) bytes, 1 where the source is real; None: all real.
        self.mask = None if src_mask is None else np.ascontiguousarray(np.asarray(src_mask).reshape(B, S), dtype=np.uint8)
        self.capacity = capacity
        self.dims = (ctypes.c_int * 7)(c.hidden_size, c.num_heads, c.head_dim, c.ffn_size, c.vocab_size,
                                       len(cross), capacity)
        self.eps = c.layer_norm_eps
        self.position = 0
        self.lib.b2b_step_set_threads(_load.threads())  # for this decoding: the cores others leave free

    def __call__(self, tokens: mx.array, reorder: mx.array | None = None,
                 states: np.ndarray | None = None) -> np.ndarray:
        """Logits or log-probabilities (R, V), a fresh float32 array, for the newest tokens
        (R, 1); `reorder` first keeps cache rows `reorder` (beam search). `states`, a
        C-contiguous float32 (R, C) array, receives the decoder's final states."""
        if reorder is not None:
            rows = np.ascontiguousarray(np.asarray(reorder), dtype=np.int32).reshape(-1)
            if rows.shape[0] != self.R:
                raise ValueError(f"Expected {self.R} rows to keep, got {rows.shape[0]}.")
            ok = self.lib.b2b_reorder(self.dims, self.R, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                                      self.position, self._k, self._v)
            self._check(ok)
        ids = np.ascontiguousarray(np.asarray(tokens).reshape(-1), dtype=np.int32)
        if ids.shape[0] != self.R or ids.min() < 0 or ids.max() >= self.V:
            raise ValueError(f"Expected {self.R} token ids in [0, {self.V}), got {ids.tolist()}.")
        if states is not None and (states.shape != (self.R, self.C) or states.dtype != np.float32
                                   or not states.flags.c_contiguous):
            raise ValueError(f"states must be a C-contiguous float32 ({self.R}, {self.C}) array.")
        out = np.empty((self.R, self.V), np.float32)
        mask = self.mask.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)) if self.mask is not None else None
        ok = self.lib.b2b_decode_step(
            self.dims, self.eps, self._table, self._half_table, self.R, self.B,
            ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), self.position, self._k, self._v, self._ck, self._cv, self.S, mask, int(self.log_probs),
            out.ctypes.data_as(_F32P), states.ctypes.data_as(_F32P) if states is not None else None)
        self._check(ok)
        self.position += 1
        return out

    def _check(self, status: int) -> None:
        if status == -2:
            raise MemoryError("Out of memory in a decoding step.")
        if status != 0:
            raise ValueError(f"Decoding step {self.position} does not fit the cache (capacity {self.capacity}).")
