"""train/lineage.py: a model warm-started from earlier runs' weights carries those runs along,
through run folders and exported checkpoints, and its model card totals them."""
from __future__ import annotations

import json

from train import finetune
from train.checkpoints import list_checkpoints
from train.export import main as export_main
from train.lineage import LINEAGE, lineage_of

from conftest import FIXTURES

ARGS = [
    "--data", str(FIXTURES / "cnndm_tok_sample.jsonl.gz"), "--limit", "24", "--max-source-len", "48",
    "--max-target-len", "16", "--batch-size", "4", "--rouge-examples", "0", "--val-examples", "4",
    "--warmup-steps", "0", "--lr", "1e-3", "--eval-every", "0", "--log-every", "1",
]


def test_runs_carry_their_lineage_through_run_folders_and_exports(tmp_path):
    first, second, third = (str(tmp_path / name) for name in ("first", "second", "third"))
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", first, "--max-steps", "3", "--seed", "1"]) == 0
    assert lineage_of(list_checkpoints(first)[-1][1])[0]["init"] == "random"

    # --init a run folder: its newest checkpoint, whose run is recorded
    assert finetune.main(ARGS + ["--init", first, "--out", second, "--max-steps", "2", "--seed", "2"]) == 0
    shipped = tmp_path / "shipped"
    assert export_main(["--checkpoint", list_checkpoints(second)[-1][1], "--out", str(shipped), "--dtype", "float32"]) == 0
    runs = json.loads((shipped / LINEAGE).read_text())
    assert [(r["run"], r["steps"], r["examples"]) for r in runs] == [("first", 3, 12), ("second", 2, 8)]
    assert runs[1]["init"] == first and runs[1]["settings"]["seed"] == 2

    # --init the exported folder: the next run, and its export, carry both earlier runs on
    assert finetune.main(ARGS + ["--init", str(shipped), "--out", third, "--max-steps", "1", "--seed", "3"]) == 0
    again = tmp_path / "again"
    assert export_main(["--checkpoint", list_checkpoints(third)[-1][1], "--out", str(again), "--dtype", "float32"]) == 0
    assert [r["steps"] for r in lineage_of(str(again))] == [3, 2, 1]
    card = (again / "MODEL_CARD.md").read_text()
    assert "In all, 3 runs, each from the one before: 6 optimizer steps, 24 examples," in card
    assert "| first | summarization | 3 | 12 |" in card and "| third | summarization | 1 | 4 |" in card
    assert "The last run:\n- Task: summarization; optimizer steps: 1; examples seen: 4" in card


def test_a_single_run_has_no_lineage_table_and_a_resume_keeps_what_it_started_from(tmp_path):
    run = str(tmp_path / "run")
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", run, "--max-steps", "2", "--save-every", "1"]) == 0
    out = tmp_path / "out"
    assert export_main(["--checkpoint", list_checkpoints(run)[-1][1], "--out", str(out), "--dtype", "float32"]) == 0
    assert "In all" not in (out / "MODEL_CARD.md").read_text()
    assert [r["steps"] for r in json.loads((out / LINEAGE).read_text())] == [2]

    child = str(tmp_path / "child")
    assert finetune.main(ARGS + ["--init", str(out), "--out", child, "--max-steps", "2", "--save-every", "1"]) == 0
    assert finetune.main(ARGS + ["--init", str(out), "--out", child, "--max-steps", "3", "--resume"]) == 0
    assert [r["steps"] for r in lineage_of(list_checkpoints(child)[-1][1])] == [2, 3]


def test_a_broken_lineage_file_does_not_stop_a_run(tmp_path, tiny_model, tokenizer, caplog):
    from b2b import save_checkpoint

    ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "hand_made"))
    (tmp_path / "hand_made" / LINEAGE).write_text("{not json")
    run = str(tmp_path / "run")
    assert finetune.main(ARGS + ["--init", ckpt, "--out", run, "--max-steps", "1"]) == 0
    assert "are not recorded" in caplog.text
    assert [r["steps"] for r in lineage_of(list_checkpoints(run)[-1][1])] == [1]


def test_reexporting_an_export_keeps_its_runs_and_an_export_onto_itself_is_refused(tmp_path):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", first, "--max-steps", "2"]) == 0
    assert finetune.main(ARGS + ["--init", first, "--out", second, "--max-steps", "1"]) == 0
    shipped, again = tmp_path / "shipped", tmp_path / "int8"
    assert export_main(["--checkpoint", list_checkpoints(second)[-1][1], "--out", str(shipped), "--dtype", "float32"]) == 0
    assert export_main(["--checkpoint", str(shipped), "--out", str(again), "--dtype", "int8"]) == 0
    assert json.loads((again / LINEAGE).read_text()) == json.loads((shipped / LINEAGE).read_text())
    card = (again / "MODEL_CARD.md").read_text()
    assert "In all, 2 runs" in card and "The last run" not in card and "optimizer steps: 0" not in card

    assert export_main(["--checkpoint", str(shipped), "--out", str(shipped)]) == 2  # would lose its reports and runs
    assert (shipped / LINEAGE).is_file()


def test_a_run_restarted_without_init_drops_the_lineage_an_earlier_start_recorded(tmp_path):
    first, run = str(tmp_path / "first"), tmp_path / "run"
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", first, "--max-steps", "1"]) == 0
    (run).mkdir()
    (run / "init_lineage.json").write_text(json.dumps([{"run": "stale", "steps": 9}]))  # a start that died early
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", str(run), "--max-steps", "1"]) == 0
    assert not (run / "init_lineage.json").exists()
    assert [r["run"] for r in lineage_of(list_checkpoints(str(run))[-1][1])] == ["run"]


def test_a_checkpoint_copied_out_of_its_run_keeps_its_counts_but_not_its_runs_settings(tmp_path):
    import shutil

    run = str(tmp_path / "run")
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", run, "--max-steps", "2"]) == 0
    copy = tmp_path / "elsewhere" / "best"
    shutil.copytree(list_checkpoints(run)[-1][1], copy)
    (record,) = lineage_of(str(copy))
    assert (record["run"], record["steps"], record["examples"]) == ("best", 2, 8)
    assert record["hardware"].startswith("not recorded") and record["settings"] == {}


def test_an_averaged_export_says_so_in_its_lineage(tmp_path):
    run = str(tmp_path / "run")
    assert finetune.main(ARGS + ["--preset", "tiny", "--out", run, "--max-steps", "2", "--save-every", "1", "--keep-last", "2"]) == 0
    (one, older), (two, newest) = list_checkpoints(run)
    out = tmp_path / "avg"
    assert export_main(["--checkpoint", newest, "--average", older, "--out", str(out), "--dtype", "float32"]) == 0
    (record,) = json.loads((out / LINEAGE).read_text())
    assert record["steps"] == 2 and record["averaged_with"] == ["step_0000001"]
