"""The training tasks' data: where validation comes from (--val-data, the data folder's own
validation split, or a held-out tail) and the Lead-3 baseline scored once per run."""
from __future__ import annotations

import json
import logging

import mlx.core as mx
import pytest

from b2b import B2BConfig, Bert2Bert
from train import evaluate as evaluate_module
from train.text_data import load_text_documents, pack_mlm_blocks
from train.finetune import FinetuneSettings, SummarizationTask
from train.pretrain import MLMTask, PretrainSettings
from train.writer import MetricWriter

from conftest import FIXTURES


def write_pairs(path, rows) -> None:
    path.write_text("".join(json.dumps({"article": r["article"], "highlights": r["highlights"]}) + "\n" for r in rows))


def test_finetune_uses_the_data_folders_validation_split(tmp_path, tokenizer, cnndm_rows, caplog):
    write_pairs(tmp_path / "train.jsonl", cnndm_rows[:30])
    write_pairs(tmp_path / "val.jsonl", cnndm_rows[30:36])
    caplog.set_level(logging.INFO)
    s = FinetuneSettings(data=str(tmp_path), max_source_len=32, max_target_len=16, val_examples=4, rouge_examples=6)
    task = SummarizationTask(s, tokenizer, 512)
    assert len(task.train) == 30  # nothing carved out of the training pairs
    assert task.val_text.articles == [r["article"].strip() for r in cnndm_rows[30:36]]
    assert f"Validation: 6 pairs from {tmp_path / 'val.jsonl'}" in caplog.text


def test_finetune_holds_out_pairs_without_a_validation_split(tmp_path, tokenizer, cnndm_rows, caplog):
    write_pairs(tmp_path / "train.jsonl", cnndm_rows[:100])
    caplog.set_level(logging.INFO)
    task = SummarizationTask(FinetuneSettings(data=str(tmp_path), max_source_len=32, max_target_len=16), tokenizer, 512)
    assert (len(task.train), len(task.val)) == (98, 2)
    assert "Validation: the last 2 pairs" in caplog.text


def test_pretrain_uses_the_data_folders_validation_files(tmp_path, tokenizer, caplog):
    lines = (FIXTURES / "wikitext_sample.tokens").read_text().splitlines(keepends=True)
    (tmp_path / "wiki.train.tokens").write_text("".join(lines[:800]))
    (tmp_path / "wiki.valid.tokens").write_text("".join(lines[800:]))
    caplog.set_level(logging.INFO)
    s = PretrainSettings(data=str(tmp_path), block_size=64)
    task = MLMTask(s, tokenizer)
    train_docs = load_text_documents(str(tmp_path / "wiki.train.tokens"))
    valid_docs = load_text_documents(str(tmp_path / "wiki.valid.tokens"))
    assert len(task.train[0]) == len(pack_mlm_blocks(train_docs, tokenizer, 64))  # all train documents
    assert (task.val[0] == pack_mlm_blocks(valid_docs, tokenizer, 64)).all()
    assert f"Validation: {len(valid_docs)} documents from {tmp_path}" in caplog.text


def test_lead3_is_scored_once_per_run(tmp_path, tokenizer, cnndm_rows, monkeypatch):
    calls = []
    lead3 = evaluate_module.lead3
    monkeypatch.setattr(evaluate_module, "lead3", lambda article: calls.append(article) or lead3(article))
    write_pairs(tmp_path / "pairs.jsonl", cnndm_rows[:20])
    s = FinetuneSettings(data=str(tmp_path / "pairs.jsonl"), val_data=str(tmp_path / "pairs.jsonl"), max_source_len=32,
                         max_target_len=8, val_examples=2, rouge_examples=2, samples=0, batch_size=2)
    task = SummarizationTask(s, tokenizer, 512)
    mx.random.seed(0)
    model = Bert2Bert(B2BConfig.preset("tiny", dropout=0.0))
    model.eval()
    with MetricWriter(str(tmp_path / "run")) as writer:
        first = task.evaluate(model, 1, writer)
        second = task.evaluate(model, 2, writer)
    assert len(calls) == 2  # the two ROUGE articles, at the first evaluation only
    assert set(first) == set(second) >= {"val/loss", "val/rouge2"}


@pytest.mark.parametrize(
    "setting, highlights, cleaned, kept",
    [
        # CNN's "NEW:" label on updated stories: removed
        ("keep_update_labels", ["new : fire is out .", "crews stay ."], "Fire is out. Crews stay.", "New: fire is out. Crews stay."),
        # a line with no end mark: ended with a full stop, so the next sentence is not run on
        ("keep_open_sentences", ['he made " grey gardens "', "he was 88 ."], 'He made "grey gardens". He was 88.', 'He made "grey gardens" he was 88.'),
    ],
)
def test_finetune_cleans_training_summaries_unless_kept(tmp_path, tokenizer, setting, highlights, cleaned, kept):
    rows = [{"article": f"story {i} about a fire .", "highlights": highlights} for i in range(20)]
    write_pairs(tmp_path / "train.jsonl", rows)
    write_pairs(tmp_path / "val.jsonl", rows[:2])
    texts = {}
    for keep in (False, True):
        s = FinetuneSettings(data=str(tmp_path), max_source_len=32, max_target_len=24, **{setting: keep})
        task = SummarizationTask(s, tokenizer, 512)
        texts[keep] = {tokenizer.decode(t.tolist()) for t in task.train.targets}  # decode() detokenizes
    assert texts == {False: {cleaned}, True: {kept}}
    assert setting in FinetuneSettings.RUN_IDENTITY  # a resume may not switch it


def test_finetune_records_the_source_length_it_trains_on_in_the_model(tmp_path, tokenizer, cnndm_rows, tiny_model):
    write_pairs(tmp_path / "train.jsonl", cnndm_rows[:10])
    write_pairs(tmp_path / "val.jsonl", cnndm_rows[10:12])
    task = SummarizationTask(FinetuneSettings(data=str(tmp_path), max_source_len=40, max_target_len=16), tokenizer, 512)
    task.prepare(tiny_model)
    try:
        assert tiny_model.trained_source_length == 40 and tiny_model.source_limit == 40  # saved as decoding.json
    finally:
        tiny_model.trained_source_length = None
