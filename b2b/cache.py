"""Per-layer decoder caches for generation.

Self-attention keys/values grow by one position per step; cross-attention keys/values are
projected from the encoder output once per input and reused for every generated token (and by
every beam of that input: a beam step has R = B * beams rows against B inputs' K/V)."""
from __future__ import annotations

import mlx.core as mx


class LayerCache:
    """One decoder layer's cache: growing self-attention K/V and fixed cross-attention K/V."""

    def __init__(self, cross_kv: tuple[mx.array, mx.array]):
        self.keys: mx.array | None = None  # (R, H, T, D)
        self.values: mx.array | None = None
        self.cross_kv = cross_kv  # (B, H, S, D) each, one per input

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Append this step's keys/values and return all of them so far."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = mx.concatenate([self.keys, k], axis=2)
            self.values = mx.concatenate([self.values, v], axis=2)
        return self.keys, self.values

    @property
    def offset(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def self_mask(self, num_queries: int) -> str | None:
        """Self-attention mask for the newest queries: one new token sees every cached key."""
        return "causal" if num_queries > 1 else None

    def reorder(self, rows: mx.array) -> None:
        """Keep self-attention rows `rows` (beam search). Cross K/V stay: they are held once per
        input and shared by its beams, and beams never move between inputs."""
        if self.keys is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]


class StepPosition:
    """Where a compiled decoding step writes, shared by every layer's StaticLayerCache: the
    write offset and the keys one new token may see are built once per step, not once per
    layer (each is a kernel, and a step's time is mostly MLX's fixed cost per kernel)."""

    def __init__(self, position: mx.array, capacity: int):
        self.position = position  # () int32: where the next token's keys go
        self.start = position.reshape(1)  # (1,): the slice_update offset
        self.visible = mx.arange(capacity)[None, :] <= position  # (1, capacity) bool


class StaticLayerCache:
    """A layer cache with fixed shapes, for a compiled decoding step: self-attention K/V live in
    preallocated (R, H, capacity, D) buffers, written at `at.position` (an int32 array, so one
    compiled step serves every position), and queries see the keys up to their own position."""

    def __init__(self, cross_kv: tuple[mx.array, mx.array], keys: mx.array, values: mx.array, at: StepPosition):
        self.cross_kv = cross_kv  # (B, H, S, D) each, one per input
        self.keys, self.values = keys, values  # (R, H, capacity, D): R = B * beams rows
        self.at = at

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, k, self.at.start, axes=(2,))
        self.values = mx.slice_update(self.values, v, self.at.start, axes=(2,))
        return self.keys, self.values

    @property
    def offset(self) -> mx.array:
        return self.at.position

    def self_mask(self, num_queries: int) -> mx.array:
        """(Tq, capacity) bool: query i (at position + i) sees keys 0 .. position + i; the
        unwritten rest of the buffer is masked out."""
        if num_queries == 1:
            return self.at.visible
        at = self.at.position + mx.arange(num_queries)  # (Tq,)
        return mx.arange(self.keys.shape[2])[None, :] <= at[:, None]


class DecoderCache:
    """All layers' caches plus the source mask, handed to `Bert2Bert.decode_step`."""

    def __init__(self, layers: list[LayerCache], cross_mask: mx.array | None):
        self.layers = layers
        self.cross_mask = cross_mask  # (B, 1, 1, S) bool, True where the source is real

    @property
    def offset(self) -> int:
        return self.layers[0].offset if self.layers else 0

    def reorder(self, rows: mx.array) -> None:
        for layer in self.layers:
            layer.reorder(rows)

    def state(self) -> list[mx.array]:
        """Every array held, for mx.eval."""
        out = [self.cross_mask] if self.cross_mask is not None else []
        for layer in self.layers:
            out += [a for a in (layer.keys, layer.values, *layer.cross_kv) if a is not None]
        return out
