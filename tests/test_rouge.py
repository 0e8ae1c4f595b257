"""ROUGE scoring (rouge_score, Porter stemming, sentence-split Lsum) and the Lead-3 baseline."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from b2b.rouge import RougeResult, lead3, rouge_scores

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def first_raw_row() -> dict:
    with open(FIXTURES / "cnndm_sample.jsonl", encoding="utf-8") as f:
        return json.loads(f.readline())


def ptb_rows() -> list[dict]:
    with gzip.open(FIXTURES / "cnndm_tok_sample.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_identical_is_100() -> None:
    ref = first_raw_row()["highlights"]
    result = rouge_scores([ref, "the cat sat on the mat ."], [ref, "the cat sat on the mat ."])
    assert isinstance(result, RougeResult)
    assert result.to_dict() == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeLsum": 100.0})
    assert len(result.per_example) == 2 and set(result.per_example[0]) == {"rouge1", "rouge2", "rougeLsum"}


def test_disjoint_is_0() -> None:
    result = rouge_scores(["alpha beta gamma."], ["delta epsilon zeta."])
    assert result.to_dict() == {"rouge1": 0.0, "rouge2": 0.0, "rougeLsum": 0.0}


def test_known_partial_overlap() -> None:
    # 5 of 6 unigrams shared, 3 of 5 bigrams, LCS "the cat on the mat" = 5.
    result = rouge_scores(["the cat sat on the mat"], ["the cat lay on the mat"])
    assert result.rouge1 == pytest.approx(100 * 5 / 6)
    assert result.rouge2 == pytest.approx(60.0)
    assert result.rougeLsum == pytest.approx(100 * 5 / 6)
    # Means are over examples: one perfect pair and one disjoint pair average to 50.
    assert rouge_scores(["a b c", "x y"], ["a b c", "p q"]).rouge1 == pytest.approx(50.0)


def test_stemming_and_ptb_references() -> None:
    assert rouge_scores(["the dogs were running"], ["the dog was run"]).rouge1 == pytest.approx(75.0)
    # A PTB reference (`did n't`, list of sentences) matches the readable prediction exactly.
    ptb_reference = ["he did n't go .", "the man 's dog stayed ."]
    result = rouge_scores(["He didn't go. The man's dog stayed."], [ptb_reference])
    assert result.to_dict() == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeLsum": 100.0})


def test_lsum_uses_sentence_splitting() -> None:
    pred, ref = "the dog ran home. the cat sat down.", "the cat sat down. the dog ran home."
    result = rouge_scores([pred], [ref])
    # As one sentence the LCS would be 4 of 8 tokens; per sentence every token is matched.
    assert result.rouge1 == pytest.approx(100.0)
    assert result.rougeLsum == pytest.approx(100.0)
    assert result.rouge2 < 100.0
    as_list = rouge_scores([pred], [["the cat sat down.", "the dog ran home."]])
    assert as_list.to_dict() == pytest.approx(result.to_dict())


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        rouge_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty"):
        rouge_scores([], [])
    with pytest.raises(ValueError):
        rouge_scores("a", "a")
    with pytest.raises(ValueError):
        rouge_scores([None], ["a"])


def test_lead3_on_fixture_articles() -> None:
    raw = first_raw_row()["article"]
    lines = lead3(raw).split("\n")
    assert lines == [
        "(CNN)Share, and your gift will be multiplied.",
        "That may sound like an esoteric adage, but when Zully Broussard selflessly decided to give one "
        "of her kidneys to a stranger, her generosity paired up with big data.",
        "It resulted in six patients receiving transplants.",
    ]
    assert lead3(raw, n=1) == lines[0] and lead3(raw, n=0) == ""
    rows = [r for r in ptb_rows() if r["article"].strip()][:50]
    for row in rows:
        lines = lead3(row["article"]).split("\n")
        lead = " ".join(" ".join(lines).split())
        assert len(lines) == 3 and " ".join(row["article"].split()).startswith(lead)
    # Lead-3 is a strong baseline on CNN: well above chance, below a perfect summary.
    score = rouge_scores([lead3(r["article"]) for r in rows], [r["highlights"] for r in rows])
    assert 20.0 < score.rouge1 < 50.0 and 5.0 < score.rouge2 < score.rouge1
