"""Checkpoints: a folder with `model.safetensors`, `config.json`, the tokenizer files and, for a
model trained on a fixed source length, `decoding.json` (`{"max_source_length": N}`).

Written to `NAME.tmp/` and renamed into place, so a reader (the demo's hot reload) never sees
half of one. Loading is strict: a missing, unexpected or misshapen tensor is an error naming
the tensor and the path."""
from __future__ import annotations

import json
import os
import shutil

import mlx.core as mx
from mlx.utils import tree_flatten

from .config import B2BConfig, ConfigError
from .model import Bert2Bert
from .tokenizer import Tokenizer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
DECODING_FILE = "decoding.json"  # {"max_source_length": N}: how the model was trained to be used (not architecture)
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
SAVE_DTYPES = (*_DTYPES, "int8")
_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_Q_GROUP = 64  # int8 affine quantization: one scale and offset per 64 weights
_Q_SCALES, _Q_BIASES = ".__scales", ".__biases"


class CheckpointError(ValueError):
    """A checkpoint that exists but cannot be loaded (missing or misshapen tensor, bad file),
    or an unknown precision asked of one."""


_NAME_OF = {v: k for k, v in _DTYPES.items()}


def dtype_name(dtype: object, allowed: tuple[str, ...] = SAVE_DTYPES) -> str:
    """The canonical name of a precision given as a name, an alias (fp16, half, bf16, fp32)
    or an mx.Dtype; CheckpointError (a ValueError) listing `allowed` otherwise."""
    if isinstance(dtype, mx.Dtype) and _NAME_OF.get(dtype) in allowed:
        return _NAME_OF[dtype]
    name = _ALIASES.get(dtype.lower(), dtype.lower()) if isinstance(dtype, str) else None
    if name not in allowed:
        aliases = ", ".join(a for a, full in _ALIASES.items() if full in allowed)
        raise CheckpointError(f"dtype must be one of {', '.join(allowed)} (or {aliases}), got {dtype!r}.")
    return name


def save_checkpoint(
    model: Bert2Bert,
    tokenizer: Tokenizer,
    path: str,
    dtype: str | None = None,
    extra: dict[str, dict | list] | None = None,
    arrays: dict[str, dict[str, mx.array]] | None = None,
) -> str:
    """Write `model` (optionally cast to float16/bfloat16, or its matrices quantized to 8 bits
    per weight with float16 scales: "int8", ~4x smaller than float32) and `tokenizer` to the
    folder `path` atomically. `extra` adds JSON files (e.g. trainer_state.json) and `arrays` extra
    safetensors files (e.g. optimizer.safetensors) inside the same atomic write."""
    if dtype is not None:
        dtype = dtype_name(dtype, SAVE_DTYPES)
    if model.trained_source_length is not None and not _readable_length(model.trained_source_length, model.config.max_positions):
        raise CheckpointError(
            f"trained_source_length must be None or a whole number from 3 to {model.config.max_positions}, "
            f"got {model.trained_source_length!r}."
        )
    path = os.path.abspath(path)
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    weights = dict(tree_flatten(model.parameters()))
    if dtype == "int8":
        weights = _quantize(weights)
    elif dtype is not None:
        weights = {k: v.astype(_DTYPES[dtype]) for k, v in weights.items()}
    mx.save_safetensors(os.path.join(tmp, WEIGHTS), weights, metadata={"format": "b2b"})
    model.config.save(tmp)
    if model.trained_source_length:
        with open(os.path.join(tmp, DECODING_FILE), "w") as f:
            json.dump({"max_source_length": int(model.trained_source_length)}, f, indent=2)
    tokenizer.save(tmp)
    for name, data in (extra or {}).items():
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(data, f, indent=2)
    for name, tensors in (arrays or {}).items():
        mx.save_safetensors(os.path.join(tmp, name), tensors)
    _fsync_dir(tmp)
    old = path + ".old"
    if os.path.exists(path):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def _quantize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """8-bit affine quantization of every matrix whose rows split into groups of 64;
    vectors (biases, LayerNorm) are kept in float16."""
    out = {}
    for name, w in weights.items():
        if w.ndim == 2 and w.shape[-1] % _Q_GROUP == 0:
            q, scales, biases = mx.quantize(w, group_size=_Q_GROUP, bits=8)
            out[name], out[name + _Q_SCALES], out[name + _Q_BIASES] = q, scales.astype(mx.float16), biases.astype(mx.float16)
        else:
            out[name] = w.astype(mx.float16)
    return out


def _dequantize(loaded: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for name, w in loaded.items():
        if name.endswith((_Q_SCALES, _Q_BIASES)):
            continue
        if name + _Q_SCALES in loaded:
            w = mx.dequantize(
                w, loaded[name + _Q_SCALES].astype(mx.float32), loaded[name + _Q_BIASES].astype(mx.float32),
                group_size=_Q_GROUP, bits=8,
            )
        out[name] = w
    return out


def _fsync_dir(folder: str) -> None:
    """Flush the files' data so a crash after the rename cannot leave empty files behind."""
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            os.fsync(f.fileno())


def is_checkpoint(path: str) -> bool:
    """True for a complete b2b checkpoint folder (not a `.tmp` being written)."""
    return (
        os.path.isdir(path)
        and not path.rstrip("/").endswith((".tmp", ".old"))
        and os.path.isfile(os.path.join(path, WEIGHTS))
        and os.path.isfile(os.path.join(path, CONFIG))
    )


def load_checkpoint(path: str, dtype: str | None = None) -> tuple[Bert2Bert, Tokenizer]:
    """Model and tokenizer from a b2b checkpoint folder. A Hugging Face BERT folder (its
    config.json has `model_type`) is warm-started instead. `dtype` (float32, float16, bfloat16,
    or fp32, fp16, half, bf16) casts the weights."""
    if dtype is not None:
        dtype = dtype_name(dtype, tuple(_DTYPES))
    if not os.path.isdir(path):
        raise FileNotFoundError(f"No checkpoint folder at {path}.")
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"No {CONFIG} in {path}: not a checkpoint folder.")
    try:
        with open(cfg_path) as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON ({e}).") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_path} must hold a JSON object of settings, not a {type(raw).__name__}.")
    tokenizer = _load_tokenizer(path)
    if "model_type" in raw:  # a Hugging Face folder
        from .convert import load_hf_bert

        model = load_hf_bert(path)
    else:
        try:
            config = B2BConfig.from_dict(raw)
        except ConfigError as e:
            raise CheckpointError(f"{cfg_path} has an invalid setting: {e}") from e
        model = Bert2Bert(config)
        _load_weights_strict(model, os.path.join(path, WEIGHTS))
    model.trained_source_length = _trained_source_length(path, model.config.max_positions)
    if dtype is not None:
        model.set_dtype(_DTYPES[dtype])
    model.eval()
    mx.eval(model.parameters())
    return model, tokenizer


def _readable_length(n: object, max_positions: int) -> bool:
    """A source length a model can be told to read: [CLS], a word and [SEP], up to its positions."""
    return isinstance(n, int) and not isinstance(n, bool) and 3 <= n <= max_positions


def _trained_source_length(path: str, max_positions: int) -> int | None:
    """decoding.json's max_source_length (None without the file: older checkpoints, Hugging Face folders)."""
    file = os.path.join(path, DECODING_FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            n = json.load(f).get("max_source_length")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CheckpointError(f"{file} must be a JSON object like {{\"max_source_length\": 320}} ({e}).") from e
    if n is None:
        return None
    if not _readable_length(n, max_positions):
        raise CheckpointError(f"{file}: max_source_length must be a whole number from 3 to {max_positions}, got {n!r}.")
    return n


def _load_tokenizer(path: str) -> Tokenizer:
    has_files = any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "vocab.txt"))
    return Tokenizer.from_pretrained(path) if has_files else Tokenizer.default()


def _load_weights_strict(model: Bert2Bert, weights_path: str) -> None:
    if not os.path.isfile(weights_path):
        raise FileNotFoundError(f"Missing weights file {weights_path}.")
    try:
        loaded = _dequantize(mx.load(weights_path))
    except (RuntimeError, ValueError, OSError) as e:
        raise CheckpointError(f"Cannot read {weights_path}: {e}") from e
    expected = dict(tree_flatten(model.parameters()))
    for name, value in expected.items():
        if name not in loaded:
            raise CheckpointError(f"Tensor {name} is missing from {weights_path}.")
        if loaded[name].shape != value.shape:
            raise CheckpointError(
                f"Tensor {name} in {weights_path} has shape {tuple(loaded[name].shape)}, "
                f"expected {tuple(value.shape)}."
            )
    unexpected = sorted(set(loaded) - set(expected))
    if unexpected:
        raise CheckpointError(f"Unexpected tensor {unexpected[0]} in {weights_path} (config.json does not match).")
    # Keep the saved precision's values but compute in float32 unless asked otherwise.
    model.load_weights([(k, v.astype(mx.float32)) for k, v in loaded.items()])
