"""Input checks of the app's boundary (demo/validate.py): one sentence per problem."""
from __future__ import annotations

import gzip
import json
import re

import pytest

from demo.validate import (
    CHARS_PER_POSITION,
    MAX_TEXT_BYTES,
    BadInput,
    check_data_file,
    check_text,
    clip_text,
    data_fields,
    decoding_kwargs,
    read_text_file,
)


@pytest.mark.parametrize("text", [None, "", "   ", "\n\t \n"])
def test_empty_text_is_refused_with_a_sentence(text):
    with pytest.raises(BadInput, match="no text to summarize"):
        check_text(text)


def test_text_of_a_megabyte_is_refused():
    with pytest.raises(BadInput, match="over the 1 MB limit"):
        check_text("a" * MAX_TEXT_BYTES)
    assert check_text("a" * (MAX_TEXT_BYTES - 1))


def test_oversized_text_names_the_model_input_size_not_a_constant():
    with pytest.raises(BadInput, match="reads only its first 128 tokens") as err:
        check_text("a" * MAX_TEXT_BYTES, max_positions=128)
    assert "512" not in str(err.value)
    with pytest.raises(BadInput, match="reads only the start of it"):
        check_text("a" * MAX_TEXT_BYTES)


def test_long_text_is_cut_before_tokenizing():
    limit = CHARS_PER_POSITION * 128
    short = "word " * 10
    assert clip_text(short, 128) is short
    cut = clip_text("word " * 200_000, 128)  # a megabyte pasted
    assert limit // 2 < len(cut) <= limit and cut.endswith("word")  # at a space, not mid-word
    assert clip_text("x" * (3 * limit), 128) == "x" * limit  # no space: a hard cut


def test_text_with_nul_bytes_is_refused():
    with pytest.raises(BadInput, match="binary"):
        check_text("abc\x00def")


def test_read_text_file(tmp_path):
    good = tmp_path / "a.md"
    good.write_bytes("\ufeffCafé au lait.".encode("utf-8"))
    assert read_text_file(str(good)) == "Café au lait."  # BOM dropped

    latin = tmp_path / "latin.txt"
    latin.write_bytes("Café".encode("latin-1"))
    with pytest.raises(BadInput, match="not UTF-8"):
        read_text_file(str(latin))

    binary = tmp_path / "img.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(BadInput, match="binary"):
        read_text_file(str(binary))

    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(BadInput, match="empty"):
        read_text_file(str(empty))

    with pytest.raises(BadInput, match="not a .txt or .md"):
        read_text_file(str(tmp_path / "x.pdf"))
    typed = tmp_path / "article"  # a path typed in the CLI: any name, named as typed
    typed.write_text("Some news.")
    assert read_text_file(str(typed), uploaded=False) == "Some news."
    with pytest.raises(BadInput, match=re.escape(f"Could not read {tmp_path}/nowhere/a.txt (")):
        read_text_file(str(tmp_path / "nowhere" / "a.txt"), uploaded=False)

    big = tmp_path / "big.txt"
    big.write_text("word " * (MAX_TEXT_BYTES // 5 + 1))
    with pytest.raises(BadInput, match="1 MB"):
        read_text_file(str(big))

    with pytest.raises(BadInput, match="Could not read"):
        read_text_file(str(tmp_path / "missing.txt"))


def test_data_files(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(json.dumps({"story": "a", "summary": "b"}) + "\n")
    assert data_fields(str(jsonl)) == ["story", "summary"]

    csv = tmp_path / "d.csv"
    csv.write_text("doc,ref\nhello,world\n")
    assert data_fields(str(csv)) == ["doc", "ref"]

    array = tmp_path / "d.json"
    array.write_text(json.dumps([{"article": "x", "highlights": "y"}]))
    assert data_fields(str(array)) == ["article", "highlights"]

    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps({"article": "x", "highlights": "y"}) + "\n")
    assert data_fields(str(gz)) == ["article", "highlights"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not json\n")
    with pytest.raises(BadInput, match="JSON object"):
        data_fields(str(bad))

    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(BadInput, match="binary"):
        check_data_file(str(binary))

    latin = tmp_path / "latin.csv"
    latin.write_bytes("a,b\ncafé,x\n".encode("latin-1"))
    with pytest.raises(BadInput, match="not UTF-8"):
        check_data_file(str(latin))

    with pytest.raises(BadInput, match="not a .jsonl"):
        check_data_file(str(tmp_path / "x.xlsx"))

    # A spreadsheet's CSV export (and some JSONL writers) start with a UTF-8 byte-order mark.
    bom_csv = tmp_path / "bom.csv"
    bom_csv.write_bytes("\ufeffarticle,highlights\nhello,world\n".encode("utf-8"))
    assert data_fields(str(bom_csv)) == ["article", "highlights"]
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes(("\ufeff" + json.dumps({"article": "x", "highlights": "y"}) + "\n").encode("utf-8"))
    assert data_fields(str(bom_jsonl)) == ["article", "highlights"]
    with pytest.raises(BadInput, match="Upload"):
        check_data_file(None)


def test_decoding_kwargs_per_strategy():
    beam = decoding_kwargs("beam", 4, 1.2, 3, 5, 60, 1.0, 50, 0.9, -1)
    assert beam == dict(
        min_length=5, max_length=60, no_repeat_ngram_size=3, repetition_penalty=1.0, no_repeat_word=True, num_beams=4,
        length_penalty=1.2, coverage_penalty=1.0, source_spelling=True,
    )
    # The coverage penalty is a beam setting, from 0 (off) up.
    assert decoding_kwargs("beam", 4, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, True, "1.5")["coverage_penalty"] == 1.5
    assert "coverage_penalty" not in decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, True, 2.0)
    with pytest.raises(BadInput, match="Coverage penalty"):
        decoding_kwargs("beam", 4, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, True, -1)
    # The checkbox, or an API client's spelling of it; anything else is a sentence.
    assert decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, False)["no_repeat_word"] is False
    assert decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, "false")["no_repeat_word"] is False
    with pytest.raises(BadInput, match="Block word stutter must be true or false"):
        decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, "maybe")
    assert decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, True, 1.0, "off")["source_spelling"] is False
    with pytest.raises(BadInput, match="Spell words as the source does must be true or false"):
        decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.0, True, 1.0, 2)
    assert decoding_kwargs("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 1.25)["repetition_penalty"] == 1.25
    greedy = decoding_kwargs("greedy", 4, 1.2, 0, 0, 20, 1.0, 50, 0.9, -1)
    assert "num_beams" not in greedy and "do_sample" not in greedy
    sample = decoding_kwargs("sampling", 4, 1.0, 3, 0, 20, 0.7, 40, 0.9, 7)
    assert sample["do_sample"] and sample["seed"] == 7 and sample["top_k"] == 40
    assert decoding_kwargs("sampling", 1, 1.0, 3, 0, 20, 0.7, 40, 0.9, -1)["seed"] is None
    assert decoding_kwargs("beam", 4.0, 1, 3.0, 0.0, 20.0)["num_beams"] == 4  # sliders send floats


@pytest.mark.parametrize(
    "args, message",
    [
        (("nonsense",), "Decoding must be one of"),
        (("beam", 4, 1.0, 3, 30, 10), "must not exceed max length"),
        (("beam", 0), "Beams must be between"),
        (("beam", 2.5), "whole number"),
        (("beam", None), "Beams is empty"),
        (("greedy", 1, 1.0, 3, 0, 100000), "Max length must be between"),
        (("sampling", 1, 1.0, 3, 0, 20, -1.0), "Temperature must be between"),
        (("sampling", 1, 1.0, 3, 0, 20, 1.0, 50, 0.0), "Top-p must be above 0"),
        (("greedy", 1, 1.0, "x"), "must be a number"),
        (("greedy", 1, 1.0, 3, 0, 20, 1.0, 50, 0.9, -1, 0.8), "Repetition penalty must be between 1"),
        (("sampling", 1, 1.0, 3, 0, 20, 0.7, 40, 0.9, 10**14), "between -1 and 2,147,483,647, not 100,000,000,000,000"),
    ],
)
def test_invalid_decoding_settings_get_one_sentence(args, message):
    with pytest.raises(BadInput, match=message) as err:
        decoding_kwargs(*args)
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


def test_an_uploads_cache_folder_is_left_out_of_the_sentence():
    from demo.errors import sentence

    cached = "/tmp/gradio/" + "ab12" * 16 + "/val6.jsonl"
    error = ValueError(f"{cached} line 1 has no field 'nope'; its fields are: article, highlights")
    assert sentence(error) == "val6.jsonl line 1 has no field 'nope'; its fields are: article, highlights."
    assert sentence(ValueError("logs/run/x.jsonl is empty")) == "logs/run/x.jsonl is empty."  # other paths stay
