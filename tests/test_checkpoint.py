"""Checkpoint folders: round trip, precision options, atomic writes and strict loading."""
import json
import os

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from b2b import B2BConfig, Bert2Bert, CheckpointError, is_checkpoint, load_checkpoint, save_checkpoint


def _logits(model, tokenizer):
    src = mx.array(tokenizer.batch_encode(["A short article about a cat that sat on a mat."]).ids)
    return np.array(model(src, mx.ones_like(src), src[:, :5]))


def test_round_trip_is_exact(tmp_path, tiny_model, tokenizer):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    model, tok = load_checkpoint(path)
    assert model.config == tiny_model.config
    assert np.array_equal(_logits(model, tok), _logits(tiny_model, tokenizer))
    assert not os.path.exists(path + ".tmp")


@pytest.mark.parametrize("dtype,tol", [("float16", 5e-2), ("bfloat16", 2e-1), ("int8", 5e-1)])
def test_reduced_precision_saves_are_smaller_and_close(tmp_path, tiny_model, tokenizer, dtype, tol):
    full = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "f32"))
    small = save_checkpoint(tiny_model, tokenizer, str(tmp_path / dtype), dtype=dtype)
    assert os.path.getsize(f"{small}/model.safetensors") < 0.6 * os.path.getsize(f"{full}/model.safetensors")
    model, _ = load_checkpoint(small)
    assert np.abs(_logits(model, tokenizer) - _logits(tiny_model, tokenizer)).max() < tol


def test_bertshare_round_trip(tmp_path, tiny_config, tokenizer):
    model = Bert2Bert(tiny_config.replace(share_encoder_decoder=True))
    model.eval()
    loaded, _ = load_checkpoint(save_checkpoint(model, tokenizer, str(tmp_path / "share")))
    assert loaded.config.share_encoder_decoder
    assert np.array_equal(_logits(loaded, tokenizer), _logits(model, tokenizer))


def test_overwrite_replaces_atomically(tmp_path, tiny_model, tokenizer):
    path = str(tmp_path / "ck")
    save_checkpoint(tiny_model, tokenizer, path, extra={"note.json": {"v": 1}})
    save_checkpoint(tiny_model, tokenizer, path, extra={"note.json": {"v": 2}})
    assert json.load(open(f"{path}/note.json")) == {"v": 2}
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_half_written_folder_is_not_a_checkpoint(tmp_path, tiny_model, tokenizer):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    os.rename(path, path + ".tmp")
    assert not is_checkpoint(path + ".tmp")
    assert is_checkpoint(save_checkpoint(tiny_model, tokenizer, path))


def test_strict_load_names_the_missing_tensor(tmp_path, tiny_model, tokenizer):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    weights = dict(tree_flatten(tiny_model.parameters()))
    victim = "decoder.layers.1.cross_attn.key.weight"
    del weights[victim]
    mx.save_safetensors(f"{path}/model.safetensors", weights)
    with pytest.raises(CheckpointError, match=victim.replace(".", r"\.")) as e:
        load_checkpoint(path)
    assert path in str(e.value)


def test_strict_load_names_a_misshapen_tensor(tmp_path, tiny_model, tokenizer):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    cfg = json.load(open(f"{path}/config.json"))
    cfg["ffn_size"] = 96
    json.dump(cfg, open(f"{path}/config.json", "w"))
    with pytest.raises(CheckpointError, match=r"ffn\.up\.weight.*shape"):
        load_checkpoint(path)


def test_missing_folder_and_bad_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_checkpoint(str(tmp_path / "nowhere"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(str(tmp_path / "bad"))


def test_invalid_dtype(tmp_path, tiny_model, tokenizer):
    with pytest.raises(ValueError, match="dtype"):
        save_checkpoint(tiny_model, tokenizer, str(tmp_path / "x"), dtype="int3")
    assert B2BConfig.preset("tiny").vocab_size == tokenizer.vocab_size


@pytest.mark.parametrize(
    "dtype, expected",
    [("fp16", mx.float16), ("half", mx.float16), ("float16", mx.float16), ("bf16", mx.bfloat16), ("FP32", mx.float32),
     (mx.bfloat16, mx.bfloat16)],
)
def test_load_accepts_dtype_aliases(tmp_path, tiny_model, tokenizer, dtype, expected):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    model, _ = load_checkpoint(path, dtype=dtype)
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {expected}


def test_load_rejects_an_unknown_dtype_listing_the_valid_ones(tmp_path, tiny_model, tokenizer):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"), dtype="fp16")  # aliases save too
    with pytest.raises(CheckpointError, match="float32, float16, bfloat16") as e:
        load_checkpoint(path, dtype="fp8")
    assert "fp16" in str(e.value) and str(e.value).endswith(".")


@pytest.mark.parametrize(
    "content", ["[1, 2]", '{"hidden_size": "big"}', '{"hidden_size": 30, "num_heads": 4}', '{"dropout": 2.0}'],
)
def test_a_bad_config_names_its_path(tmp_path, tiny_model, tokenizer, content):
    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ck"))
    with open(f"{path}/config.json", "w") as f:
        f.write(content)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert os.path.join(path, "config.json") in str(e.value) and str(e.value).endswith(".")


def test_the_trained_source_length_travels_with_the_checkpoint(tmp_path, tiny_model, tokenizer):
    from b2b.checkpoint import DECODING_FILE

    plain = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "plain"))
    assert not (tmp_path / "plain" / DECODING_FILE).exists()  # nothing to record: older folders look like this
    model, _ = load_checkpoint(plain)
    assert model.trained_source_length is None and model.source_limit == model.config.max_positions

    tiny_model.trained_source_length = 24
    try:
        path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "trained"), dtype="float16")
    finally:
        tiny_model.trained_source_length = None
    model, _ = load_checkpoint(path)
    assert model.trained_source_length == 24 and model.source_limit == 24


@pytest.mark.parametrize("body", ['{"max_source_length": 2}', '{"max_source_length": 4096}', '{"max_source_length": "320"}', '[320]', "{not json"])
def test_a_bad_decoding_file_is_one_error_naming_it(tmp_path, tiny_model, tokenizer, body):
    from b2b.checkpoint import DECODING_FILE

    path = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / DECODING_FILE).write_text(body)
    with pytest.raises(CheckpointError, match=DECODING_FILE):
        load_checkpoint(path)


@pytest.mark.parametrize("bad", [2, 10_000, "320", True])
def test_saving_refuses_a_source_length_it_could_not_load(tmp_path, tiny_model, tokenizer, bad):
    tiny_model.trained_source_length = bad
    try:
        with pytest.raises(CheckpointError, match="trained_source_length"):
            save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ckpt"))
    finally:
        tiny_model.trained_source_length = None
    assert not (tmp_path / "ckpt").exists()
