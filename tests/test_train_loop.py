"""train/loop.py behaviours seen through train.finetune: what the last checkpoint records."""
from __future__ import annotations

from train import finetune
from train.checkpoints import TrainerState, list_checkpoints
from train.writer import read_metrics

from conftest import FIXTURES

ARGS = [
    "--preset", "tiny", "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--limit", "40",
    "--max-source-len", "64", "--max-target-len", "24", "--batch-size", "4", "--rouge-examples", "0",
    "--val-examples", "8", "--warmup-steps", "0", "--lr", "1e-3", "--log-every", "1",
]


def test_final_checkpoint_records_the_final_evaluation(tmp_path):
    """--max-steps 5 with --eval-every 3 --save-every 5: step 5 is saved inside the loop, then
    evaluated after it; its trainer_state.json must hold that evaluation (the demo shows it)."""
    out = tmp_path / "run"
    assert finetune.main(ARGS + ["--out", str(out), "--max-steps", "5", "--eval-every", "3", "--save-every", "5"]) == 0
    val = read_metrics(str(out))["val/loss"]
    assert [s for s, _ in val] == [3, 5]
    step, path = list_checkpoints(str(out))[-1]
    state = TrainerState.load(path)
    assert step == state.step == 5
    assert state.last_eval == {"val/loss": round(val[-1][1], 4)}
    best_step, best = min(((s, v) for s, v in val), key=lambda sv: sv[1])
    assert (state.best_step, state.best_metric) == (best_step, best)
    assert best_step in [s for s, _ in list_checkpoints(str(out))]  # the best is kept on disk


def test_new_lr_scale_moves_cross_attention_faster():
    """--new-lr-scale 10: the first AdamW step moves cross-attention weights 10x as far as the
    warm-startable rest (Adam's first move is the same multiple of lr for every weight)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    from b2b import B2BConfig, Bert2Bert
    from train.loop import base_learning_rate, make_optimizer
    from train.settings import TrainSettings

    mx.random.seed(0)
    model = Bert2Bert(B2BConfig.preset("tiny", dropout=0.0))
    s = TrainSettings(lr=1e-3, warmup_steps=0, weight_decay=0.0, new_lr_scale=10.0, schedule="constant")
    opt = make_optimizer(s, total_steps=10)
    before = dict(tree_flatten(model.parameters()))
    grads = {k: mx.ones_like(v) for k, v in before.items()}
    from mlx.utils import tree_unflatten

    opt.update(model, tree_unflatten(list(grads.items())))
    after = dict(tree_flatten(model.parameters()))
    moved = {k: float(np.abs(np.array(after[k] - before[k])).mean()) for k in before}
    cross = [v for k, v in moved.items() if ".cross_attn" in k]
    rest = [v for k, v in moved.items() if ".cross_attn" not in k]
    assert cross and rest
    # (MLX's AdamW has no bias correction: the first move is lr * 0.1 / sqrt(0.001), the same factor for both)
    assert np.allclose(cross, cross[0], rtol=1e-3) and np.allclose(rest, rest[0], rtol=1e-3)
    assert abs(cross[0] / rest[0] - 10.0) < 1e-2
    assert abs(base_learning_rate(opt) - 1e-3) < 1e-9
    plain = make_optimizer(TrainSettings(lr=1e-3), total_steps=10)
    assert not hasattr(plain, "optimizers")


def test_save_every_0_saves_the_best_and_the_end(tmp_path):
    """--save-every 0: no periodic checkpoints, but a new best and the final step are saved."""
    out = tmp_path / "run"
    assert finetune.main(ARGS + ["--out", str(out), "--max-steps", "3", "--eval-every", "2", "--save-every", "0", "--keep-last", "1"]) == 0
    state = TrainerState.load(list_checkpoints(str(out))[-1][1])
    assert state.step == 3 and state.best_step in (2, 3)
    assert [s for s, _ in list_checkpoints(str(out))] == sorted({state.best_step, 3})


def test_grad_norm_is_logged_without_clipping(tmp_path):
    out = tmp_path / "run"
    assert finetune.main(ARGS + ["--out", str(out), "--max-steps", "2", "--eval-every", "0", "--clip-norm", "0"]) == 0
    norms = [v for _, v in read_metrics(str(out))["train/grad_norm"]]
    assert len(norms) == 2 and all(v > 0 for v in norms)


def test_prune_always_keeps_the_newest_and_the_best(tmp_path, tiny_model, tokenizer):
    import mlx.optimizers as optim

    from train.checkpoints import prune_checkpoints, save_run_checkpoint

    run_dir = str(tmp_path / "run")
    for step in (1, 2, 3, 4):
        save_run_checkpoint(run_dir, tiny_model, tokenizer, optim.AdamW(1e-3), TrainerState(step=step), "float32")
    prune_checkpoints(run_dir, keep_last=0, best_step=2)
    assert [s for s, _ in list_checkpoints(run_dir)] == [2, 4]
    prune_checkpoints(run_dir, keep_last=1, best_step=None)
    assert [s for s, _ in list_checkpoints(run_dir)] == [4]
