"""train.pretrain on the WikiText fixture (MLM, MLM+NSP), then fine-tuning warm-started from its
checkpoint with the decoder copied from the pretrained encoder (train/init.py)."""
from __future__ import annotations

import numpy as np
import pytest

from train import finetune, pretrain
from train.checkpoints import TrainerState, list_checkpoints
from train.finetune import FinetuneSettings
from train.init import build_model
from train.writer import read_metrics

from conftest import FIXTURES

PRETRAIN = [
    "--preset", "tiny", "--data", str(FIXTURES / "wikitext_sample.tokens"), "--block-size", "64",
    "--batch-size", "4", "--val-batches", "2", "--max-steps", "3", "--warmup-steps", "0",
    "--log-every", "1", "--eval-every", "3", "--save-every", "3",
]
FINETUNE = [
    "--preset", "tiny", "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--limit", "20",
    "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4", "--rouge-examples", "0",
    "--val-examples", "8", "--max-steps", "2", "--warmup-steps", "0", "--log-every", "1", "--eval-every", "2",
]


@pytest.fixture(scope="module")
def mlm_checkpoint(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("mlm")
    assert pretrain.main(PRETRAIN + ["--out", str(out)]) == 0
    return list_checkpoints(str(out))[-1][1]


def np_(a) -> np.ndarray:
    return np.array(a)


@pytest.mark.parametrize("nsp", [False, True])
def test_pretrain_smoke(tmp_path, nsp):
    out = tmp_path / "run"
    assert pretrain.main(PRETRAIN + ["--out", str(out)] + (["--nsp"] if nsp else [])) == 0
    metrics = read_metrics(str(out))
    expected = {"train/loss", "train/mlm_loss", "train/accuracy", "val/loss", "val/accuracy", "val/perplexity"}
    nsp_tags = {"train/nsp_loss", "train/nsp_accuracy", "val/nsp_loss", "val/nsp_accuracy"}
    assert expected <= metrics.keys()
    assert (nsp_tags <= metrics.keys()) if nsp else not (nsp_tags & metrics.keys())
    assert [s for s, _ in metrics["train/loss"]] == [1, 2, 3]
    (step, loss), = metrics["val/loss"]
    assert step == 3 and np.isfinite(loss)
    assert np.isclose(metrics["val/perplexity"][0][1], np.exp(loss), rtol=1e-4)
    assert 0.0 <= metrics["val/accuracy"][0][1] <= 1.0
    if nsp:
        assert 0.0 <= metrics["val/nsp_accuracy"][0][1] <= 1.0
    (step, path), = list_checkpoints(str(out))
    state = TrainerState.load(path)
    assert (step, state.step, state.task, state.metric_name) == (3, 3, "mlm", "val/loss")


def test_finetune_from_mlm_checkpoint_copies_encoder_into_decoder(tmp_path, mlm_checkpoint):
    model, _ = build_model(FinetuneSettings(init=mlm_checkpoint, preset="tiny"))
    enc, dec = model.encoder, model.decoder
    assert np.array_equal(np_(dec.layers[0].self_attn.query.weight), np_(enc.layers[0].self_attn.query.weight))
    assert np.array_equal(np_(dec.layers[1].ffn.up.weight), np_(enc.layers[1].ffn.up.weight))
    assert np.array_equal(np_(dec.embeddings.position.weight), np_(enc.embeddings.position.weight))
    assert np.array_equal(np_(dec.lm_head.transform.weight), np_(enc.mlm_head.transform.weight))
    # Cross-attention has no encoder counterpart: it stays freshly initialised.
    assert not np.array_equal(np_(dec.layers[0].cross_attn.query.weight), np_(enc.layers[0].self_attn.query.weight))

    out = tmp_path / "ft"
    assert finetune.main(FINETUNE + ["--init", mlm_checkpoint, "--out", str(out)]) == 0
    metrics = read_metrics(str(out))
    assert [s for s, _ in metrics["train/loss"]] == [1, 2] and np.isfinite(metrics["val/loss"][0][1])
    ft_checkpoint = list_checkpoints(str(out))[-1][1]
    assert TrainerState.load(ft_checkpoint).task == "summarization"

    # A fine-tuned checkpoint is loaded as it is: its decoder is not overwritten again.
    again, _ = build_model(FinetuneSettings(init=ft_checkpoint, preset="tiny"))
    assert not np.array_equal(np_(again.decoder.layers[0].self_attn.query.weight), np_(again.encoder.layers[0].self_attn.query.weight))


def test_pretraining_leaves_the_decoder_alone(tmp_path):
    """MLM never reaches the decoder: with it frozen, AdamW's weight decay does not shrink it
    either, and the optimizer keeps no moments for it (the word table is the encoder's)."""
    import os

    import mlx.core as mx

    out = tmp_path / "run"
    args = PRETRAIN + ["--out", str(out), "--save-every", "1", "--keep-last", "3", "--weight-decay", "0.1"]
    assert pretrain.main(args) == 0
    (_, first), *_, (_, last) = list_checkpoints(str(out))
    a, b = mx.load(os.path.join(first, "model.safetensors")), mx.load(os.path.join(last, "model.safetensors"))
    decoder = [k for k in a if k.startswith("decoder.") and ".word." not in k]
    encoder = [k for k in a if k.startswith("encoder.layers.")]
    assert decoder and encoder
    assert all(np.array_equal(np_(a[k]), np_(b[k])) for k in decoder), [k for k in decoder if not np.array_equal(np_(a[k]), np_(b[k]))]
    assert not all(np.array_equal(np_(a[k]), np_(b[k])) for k in encoder)
    moments = mx.load(os.path.join(last, "optimizer.safetensors"))
    assert not [k for k in moments if k.startswith("decoder.") and ".word." not in k]
    assert [k for k in moments if k.startswith("encoder.mlm_head.")]


def test_init_accepts_a_run_folder(mlm_checkpoint):
    """--init RUN picks the run's newest checkpoint."""
    import os

    run_dir = os.path.dirname(os.path.dirname(mlm_checkpoint))
    from_run, _ = build_model(FinetuneSettings(init=run_dir))
    from_checkpoint, _ = build_model(FinetuneSettings(init=mlm_checkpoint))
    assert np.array_equal(np_(from_run.encoder.layers[1].ffn.up.weight), np_(from_checkpoint.encoder.layers[1].ffn.up.weight))
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        build_model(FinetuneSettings(init=os.path.dirname(run_dir)))
