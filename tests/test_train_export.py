"""train.export: shrinks a checkpoint, writes the model card and carries the eval reports."""
import json

from b2b import load_checkpoint, save_checkpoint
from train.export import main as export_main


def test_export_float16_with_card_notes_and_reports(tmp_path, tiny_model, tokenizer):
    ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "run" / "checkpoints" / "step_0000010"))
    report = {"n": 3, "model": {"rouge1": 10.0, "rouge2": 2.0, "rougeLsum": 9.0},
              "lead3": {"rouge1": 30.0, "rouge2": 12.0, "rougeLsum": 27.0}, "settings": {"num_beams": 4}}
    (tmp_path / "run" / "checkpoints" / "step_0000010" / "eval_test_beam4.json").write_text(json.dumps(report))
    notes = tmp_path / "notes.md"
    notes.write_text("## Limitations\nUndertrained.\n")
    out = tmp_path / "shipped"

    assert export_main(["--checkpoint", ckpt, "--out", str(out), "--dtype", "float16", "--notes", str(notes)]) == 0

    card = (out / "MODEL_CARD.md").read_text()
    assert "| model | 10.00 | 2.00 | 9.00 |" in card and "| Lead-3 | 30.00 | 12.00 | 27.00 |" in card
    assert card.rstrip().endswith("Undertrained.")
    assert json.loads((out / "eval_test_beam4.json").read_text()) == report
    load_checkpoint(str(out))  # strict load of the float16 weights
    weights = (out / "model.safetensors").stat().st_size
    full = (tmp_path / "run" / "checkpoints" / "step_0000010" / "model.safetensors").stat().st_size
    assert weights < 0.6 * full  # float16 halves the weights


def test_export_of_a_missing_checkpoint_is_one_error(tmp_path, caplog):
    assert export_main(["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_export_and_training_accept_the_precision_aliases_of_the_library(tmp_path, tiny_model, tokenizer):
    from train.finetune import FinetuneSettings
    from train.settings import parse_settings

    ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "ckpt"))
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "out"), "--dtype", "fp16"]) == 0
    assert "weights stored as float16" in (tmp_path / "out" / "MODEL_CARD.md").read_text()
    s = parse_settings(FinetuneSettings, ["--data", "x.jsonl", "--out", str(tmp_path / "run"), "--save-dtype", "BF16"])
    assert s.save_dtype == "bfloat16"
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "o2"), "--dtype", "int4"]) == 2
