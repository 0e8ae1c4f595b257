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
