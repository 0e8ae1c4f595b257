"""`python -m demo.cli`: one-shot --text/--file, and the prompt's commands."""
from __future__ import annotations

import io
import sys

import pytest

from b2b import B2BConfig, Bert2Bert, Tokenizer, save_checkpoint
from demo import cli
from demo.store import CheckpointStore


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "ckpt"
    save_checkpoint(Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default(), str(path))
    return str(path)


FAST = ["--max-length", "5", "--min-length", "0", "--num-beams", "2"]


def test_text_and_file_one_shot(ckpt, tmp_path, capsys):
    assert cli.main(["--checkpoint", ckpt, "--text", "The river flooded the town.", *FAST]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "input tokens" in err and "tokens/s" in err

    f = tmp_path / "article"  # any name works from the command line
    f.write_text("A storm hit the coast on Monday.")
    assert cli.main(["--checkpoint", ckpt, "--file", str(f), *FAST]) == 0


def test_max_source_length_sets_what_is_read(ckpt, capsys):
    words = " ".join(f"word{i}" for i in range(60))
    assert cli.main(["--checkpoint", ckpt, "--text", words, "--max-source-length", "16", *FAST]) == 0
    assert "truncated to 16;" in capsys.readouterr().err
    assert cli.main(["--checkpoint", ckpt, "--text", words, "--max-source-length", "-1", *FAST]) == 2
    assert "--max-source-length cannot be negative" in capsys.readouterr().err


def test_boolean_flags_take_true_or_false(ckpt, capsys):
    assert cli.main(["--checkpoint", ckpt, "--text", "The river flooded.", "--no-repeat-word", "false", *FAST]) == 0
    with pytest.raises(SystemExit):
        cli.main(["--checkpoint", ckpt, "--text", "The river flooded.", "--source-spelling", "maybe"])
    assert "--source-spelling: expected true or false, got 'maybe'" in capsys.readouterr().err


def test_errors_are_one_line_and_exit_2(ckpt, tmp_path, capsys):
    assert cli.main(["--checkpoint", ckpt, "--text", "  ", *FAST]) == 2
    assert capsys.readouterr().err.startswith("error: --text is empty")
    assert cli.main(["--watch", str(tmp_path), "--fallback", "", "--text", "hello"]) == 2
    err = capsys.readouterr().err
    # The exact command, writing where this CLI looks, and the bundled fallback it also tried.
    assert f"python -m train.finetune --preset tiny --max-steps 200 --save-every 50 --out {tmp_path / 'quick'}" in err
    assert "--fallback" not in err and err.count("\n") == 1
    assert cli.main(["--watch", str(tmp_path), "--fallback", str(tmp_path / "none"), "--text", "hello"]) == 2
    assert f"or in {tmp_path / 'none'};" in capsys.readouterr().err  # it says where else it looked
    assert cli.main(["--checkpoint", ckpt, "--text", "hi", "--min-length", "9", "--max-length", "3"]) == 2


def test_prompt_commands(ckpt, tmp_path):
    store = CheckpointStore(None, pinned=ckpt, settle_seconds=0)
    store.refresh()
    served = store.require()
    decoding = cli.decoding_from(cli.parse_args(FAST))
    text = tmp_path / "a.txt"
    text.write_text("The mayor opened the new library.")
    out, err = io.StringIO(), io.StringIO()
    for line in ["Hello there.", f">file {text}", ">file /no/such.txt", ">eval 2", ">eval x", ">nope", ""]:
        assert cli.handle(line, served, decoding, out, err)
    assert cli.handle(">exit", served, decoding, out, err) is False
    assert "lead-3" in out.getvalue() and "2 articles" in out.getvalue()
    messages = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    assert len(messages) == 3 and "whole number" in messages[1] and "Unknown command" in messages[2]


def test_interactive_loop_reads_until_exit(ckpt, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Some news today.\n\n>exit\nnot reached\n"))
    assert cli.main(["--checkpoint", ckpt, *FAST]) == 0
    _, err = capsys.readouterr()
    assert err.count("input tokens") == 1


def test_a_multi_line_paste_is_one_article(ckpt, monkeypatch, capsys):
    article = "The storm reached the coast on Monday.\nThousands lost power.\nSchools stay closed.\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(article + "\n" + "A second article.\n\n>exit\n"))
    assert cli.main(["--checkpoint", ckpt, *FAST]) == 0
    _, err = capsys.readouterr()
    assert err.count("input tokens") == 2  # the three lines were one article
    assert "empty line" in cli.HELP


def test_blank_lines_inside_a_paste_do_not_end_the_article():
    lines = iter(["First paragraph.", "", "Second paragraph.", "", ">exit"])
    waiting = iter([True, False])  # after the first blank line more of the paste is waiting
    entry = cli.read_entry(lambda prompt: next(lines), lambda: next(waiting))
    assert entry == "First paragraph.\n\nSecond paragraph."
    assert cli.read_entry(lambda prompt: next(lines), lambda: False) == ">exit"
    assert cli.read_entry(lambda prompt: (_ for _ in ()).throw(EOFError), lambda: False) is None


def test_a_command_right_after_an_article_is_not_part_of_it(ckpt, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Some news today.\nMore news.\n>exit\nnot an article\n"))
    assert cli.main(["--checkpoint", ckpt, *FAST]) == 0
    _, err = capsys.readouterr()
    assert err.count("input tokens") == 1  # the article, then >exit ended the session


def test_an_empty_watch_folder_falls_back_to_the_shipped_checkpoint(ckpt, tmp_path, capsys):
    assert cli.main(["--watch", str(tmp_path), "--fallback", ckpt, "--text", "Some news today.", *FAST]) == 0
    assert "summary tokens" in capsys.readouterr().err
