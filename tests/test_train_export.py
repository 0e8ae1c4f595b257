"""train.export: shrinks a checkpoint, writes the model card and carries the eval reports."""
import json

from b2b import load_checkpoint, save_checkpoint
from train.export import main as export_main


def test_export_float16_with_card_notes_and_reports(tmp_path, tiny_model, tokenizer):
    ckpt = save_checkpoint(tiny_model, tokenizer, str(tmp_path / "run" / "checkpoints" / "step_0000010"))
    report = {"n": 3, "model": {"rouge1": 10.0, "rouge2": 2.0, "rougeLsum": 9.0},
              "lead3": {"rouge1": 30.0, "rouge2": 12.0, "rougeLsum": 27.0},
              "settings": {"num_beams": 4, "no_repeat_word": True, "source_spelling": False}}
    (tmp_path / "run" / "checkpoints" / "step_0000010" / "eval_test_beam4.json").write_text(json.dumps(report))
    notes = tmp_path / "notes.md"
    notes.write_text("## Limitations\nUndertrained.\n")
    out = tmp_path / "shipped"

    assert export_main(["--checkpoint", ckpt, "--out", str(out), "--dtype", "float16", "--notes", str(notes)]) == 0

    card = (out / "MODEL_CARD.md").read_text()
    assert "| model | 10.00 | 2.00 | 9.00 |" in card and "| Lead-3 | 30.00 | 12.00 | 27.00 |" in card
    assert card.rstrip().endswith("Undertrained.")
    assert "beams 4 (word-repeat bans on, source spelling off)" in card  # the decoding the figures depend on
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


def test_export_averages_checkpoints_weights_and_says_so_on_the_card(tmp_path, tiny_config, tokenizer):
    import dataclasses

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from b2b import Bert2Bert

    paths = []
    for seed in (1, 2, 3):
        mx.random.seed(seed)
        paths.append(save_checkpoint(Bert2Bert(tiny_config), tokenizer, str(tmp_path / "run" / "checkpoints" / f"step_{seed:07d}")))
    out = tmp_path / "avg"

    assert export_main(["--checkpoint", paths[2], "--average", paths[0], paths[1], "--out", str(out), "--dtype", "float32"]) == 0

    got = dict(tree_flatten(load_checkpoint(str(out))[0].parameters()))
    each = [dict(tree_flatten(load_checkpoint(p)[0].parameters())) for p in paths]
    for name in ("encoder.layers.0.self_attn.query.weight", "decoder.layers.1.cross_attn.out.weight"):
        assert not mx.allclose(each[0][name], each[1][name])  # the seeds gave different weights
        assert mx.allclose(got[name], (each[0][name] + each[1][name] + each[2][name]) / 3, atol=1e-6)
    assert "the mean of 3 checkpoints' (step_0000003, step_0000001, step_0000002)" in (out / "MODEL_CARD.md").read_text()

    # a run that changed only the dropout (`--dropout`) has the same weights' shapes: it averages
    mx.random.seed(4)
    dropped = save_checkpoint(Bert2Bert(dataclasses.replace(tiny_config, dropout=0.3)), tokenizer, str(tmp_path / "drop"))
    assert export_main(["--checkpoint", paths[0], "--average", dropped, "--out", str(tmp_path / "avg2"), "--dtype", "float32"]) == 0
    assert load_checkpoint(str(tmp_path / "avg2"))[0].config == tiny_config  # the first checkpoint's architecture

    other = dataclasses.replace(tiny_config, ffn_size=tiny_config.ffn_size * 2)
    odd = save_checkpoint(Bert2Bert(other), tokenizer, str(tmp_path / "odd"))
    assert export_main(["--checkpoint", paths[0], "--average", odd, "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_the_card_names_the_machines_the_run_trained_on_not_the_exporting_one(tmp_path, tiny_model, tokenizer):
    from train.writer import SETTINGS_TAG

    run = tmp_path / "run"
    state = {"task": "summarization", "step": 10, "wall_seconds": 360.0}
    ckpt = save_checkpoint(tiny_model, tokenizer, str(run / "checkpoints" / "step_0000010"), extra={"trainer_state.json": state})
    gpu = {"platform": "Linux x86_64", "device": "Device(gpu, 0)", "device_name": "NVIDIA H200", "mlx": "0.32.4", "cpu_count": 16}
    cpu = {"platform": "Darwin arm64", "device": "Device(cpu, 0)", "cpu_count": 8, "mlx": "0.32.4", "blas": "accelerate"}
    rows = [{"step": 0, "tag": SETTINGS_TAG, "text": json.dumps({"runtime": rt})} for rt in (gpu, gpu, cpu)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "out"), "--dtype", "float32"]) == 0
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert "h on Linux x86_64, NVIDIA H200 (MLX 0.32.4) and Darwin arm64 (8 CPU cores, MLX 0.32.4, BLAS accelerate)" in card

    (run / "metrics.jsonl").unlink()  # nothing recorded: this machine, said to be so
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "out2"), "--dtype", "float32"]) == 0
    assert "(the exporting machine: the run recorded none)" in (tmp_path / "out2" / "MODEL_CARD.md").read_text()


def test_averaging_refuses_checkpoints_trained_on_other_source_lengths(tmp_path, tiny_model, tokenizer):
    paths = []
    for n in (24, 40):
        tiny_model.trained_source_length = n
        paths.append(save_checkpoint(tiny_model, tokenizer, str(tmp_path / f"ck{n}")))
    tiny_model.trained_source_length = None
    assert export_main(["--checkpoint", paths[0], "--average", paths[1], "--out", str(tmp_path / "avg")]) == 2
    assert not (tmp_path / "avg").exists()
