"""Tests for train/data.py and train/text_data.py: loading (files, layouts, errors), MLM/NSP packing, batching."""
from __future__ import annotations

import csv
import gzip
import json
import os
import shutil

import numpy as np
import pytest

from train.data import DataError, encode_prefixes, folder_has_split, load_summarization_pairs, tokenize_pairs
from train.text_data import load_text_documents, make_nsp_pairs, pack_mlm_blocks, split_documents

from train.batching import bucketed_batches, collate

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
RAW = os.path.join(FIXTURES, "cnndm_sample.jsonl")
PTB = os.path.join(FIXTURES, "cnndm_tok_sample.jsonl.gz")
WIKI = os.path.join(FIXTURES, "wikitext_sample.tokens")
CLS, SEP, PAD = 101, 102, 0


@pytest.fixture(scope="module")
def tokenizer():
    from b2b.tokenizer import Tokenizer

    return Tokenizer.default()


class NumberTokenizer:
    """Each whitespace-separated integer is one token: lets tests see where tokens came from."""

    pad_id, cls_id, sep_id = PAD, CLS, SEP

    def encode_plain(self, texts: list[str]) -> list[list[int]]:
        return [[int(w) for w in t.split()] for t in texts]


def numbered_docs(lengths: list[int]) -> list[str]:
    """Document k holds the tokens 1000*(k+1) + i, so token // 1000 - 1 names its document."""
    return [" ".join(str(1000 * (k + 1) + i) for i in range(n)) for k, n in enumerate(lengths)]


# ---------------------------------------------------------------- summarization loading


def test_raw_cnndm_layout_keeps_newline_separated_highlights():
    data = load_summarization_pairs(RAW)
    assert len(data) == len(data.summaries) > 200
    assert data.skipped_empty == 0 and data.source == RAW
    assert all(a and s for a, s in zip(data.articles, data.summaries))
    assert any("\n" in s for s in data.summaries)  # raw highlights are "\n"-separated sentences
    with open(RAW, encoding="utf-8") as f:
        first = json.loads(f.readline())
    assert data.summaries[0] == first["highlights"].strip()


def test_ptb_cnndm_layout_joins_sentence_lists():
    data = load_summarization_pairs(PTB, limit=50)
    assert len(data) == 50
    with gzip.open(PTB, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    usable = [r for r in rows if r["article"].strip() and r["highlights"]]
    assert data.summaries[0] == "\n".join(s.strip() for s in usable[0]["highlights"])
    assert data.summaries[0].count("\n") == len(usable[0]["highlights"]) - 1


def test_folder_with_split_files_and_val_alias(tmp_path):
    shutil.copy(PTB, tmp_path / "val.jsonl.gz")
    data = load_summarization_pairs(str(tmp_path), split="validation", limit=3)
    assert len(data) == 3 and data.source.endswith("val.jsonl.gz")
    with pytest.raises(FileNotFoundError, match="test"):
        load_summarization_pairs(str(tmp_path), split="test")


def test_empty_pairs_are_skipped_and_counted(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"article": "a b c", "highlights": ["x ."]}, {"article": "", "highlights": ["y"]},
            {"article": "d e", "highlights": []}, {"article": "f g", "highlights": "z"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    data = load_summarization_pairs(str(path))
    assert data.articles == ["a b c", "f g"] and data.summaries == ["x .", "z"]
    assert data.skipped_empty == 2


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"article": "a", "highlights": "b"}\n\n{"article": "a", "highl\n')
    with pytest.raises(DataError, match=r"bad\.jsonl line 3"):
        load_summarization_pairs(str(path))


def test_missing_field_names_the_fields_present(tmp_path):
    path = tmp_path / "fields.jsonl"
    path.write_text(json.dumps({"document": "a", "summary": "b"}) + "\n")
    with pytest.raises(DataError, match=r"'article'.*document, summary"):
        load_summarization_pairs(str(path))
    data = load_summarization_pairs(str(path), article_field="document", summary_field="summary")
    assert data.articles == ["a"]


def test_missing_file_and_zero_usable_pairs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_summarization_pairs(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="nope.jsonl"):
        load_summarization_pairs(str(tmp_path / "nope.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"article": " ", "highlights": "b"}) + "\n")
    with pytest.raises(DataError, match="no usable pairs"):
        load_summarization_pairs(str(empty))


def test_json_array_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"article": "a", "highlights": ["b", "c"]}]))
    assert load_summarization_pairs(str(path)).summaries == ["b\nc"]


def test_csv_round_trip(tmp_path):
    src = load_summarization_pairs(RAW, limit=20)
    path = tmp_path / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "article", "highlights"])
        for k, (a, s) in enumerate(zip(src.articles, src.summaries)):
            writer.writerow([k, a, s])  # articles hold commas, quotes and newlines
    data = load_summarization_pairs(str(path))
    assert data.articles == src.articles and data.summaries == src.summaries
    with pytest.raises(DataError, match=r"'summary'.*id, article, highlights"):
        load_summarization_pairs(str(path), summary_field="summary")


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    with gzip.open(PTB, "rt", encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(10)]
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)  # highlights: list<string>
    data = load_summarization_pairs(str(path))
    assert data.articles == [r["article"] for r in rows if r["article"]]
    assert data.summaries[0] == "\n".join(rows[0]["highlights"])
    with pytest.raises(DataError, match=r"'text'.*source_file, index_in_file, article, highlights"):
        load_summarization_pairs(str(path), article_field="text")


def test_hub_name_goes_to_load_dataset(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"article": ["a", "", "c"], "highlights": ["x", "y", "z\nw"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_summarization_pairs("cnn_dailymail", config="3.0.0", split="val")
    assert calls == [("cnn_dailymail", "3.0.0", "validation")]
    assert data.articles == ["a", "c"] and data.summaries == ["x", "z\nw"] and data.skipped_empty == 1


def test_hub_text_dataset_rows_are_wikitext_lines(monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = ["", " = A = \n", "", " a1 \n", " = = S = = \n", " a2 \n", " = B = \n", " b1 \n"]
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: datasets.Dataset.from_dict({"text": rows}))
    assert load_text_documents("wikitext", config="wikitext-2-raw-v1", limit=5) == ["a1\na2", "b1"]
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: datasets.Dataset.from_dict({"t": ["x"]}))
    with pytest.raises(DataError, match="'text'.*t"):
        load_text_documents("some_corpus")


# ---------------------------------------------------------------- tokenizing pairs


def test_tokenize_pairs_truncates_and_keeps_final_sep(tokenizer):
    data = load_summarization_pairs(PTB, limit=40)
    out = tokenize_pairs(data, tokenizer, max_source_len=64, max_target_len=16)
    full_src = tokenizer.encode_plain(data.articles)
    full_tgt = tokenizer.encode_plain(data.summaries)
    assert len(out) == 40
    for s, t, fs, ft in zip(out.sources, out.targets, full_src, full_tgt):
        assert s.dtype == np.int32 and s[0] == CLS and s[-1] == SEP and len(s) <= 64
        assert t[0] == CLS and t[-1] == SEP and len(t) <= 16
        assert s[1:-1].tolist() == fs[:62] and t[1:-1].tolist() == ft[:14]
    assert out.num_truncated_sources == sum(len(f) > 62 for f in full_src) > 0
    assert out.num_truncated_targets == sum(len(f) > 14 for f in full_tgt)
    assert out.source_lengths.tolist() == [len(s) for s in out.sources]


def test_encode_prefixes_matches_whole_encoding(tokenizer):
    texts = load_summarization_pairs(RAW, limit=30).articles + ["a " * 50, "x" * 3000 + " tail", ""]
    full = tokenizer.encode_plain(texts)
    # A low chars_per_token forces the re-cut path; a high one the single-pass path.
    for cpt in (0.5, 5.5):
        ids, truncated = encode_prefixes(texts, tokenizer, 100, chars_per_token=cpt)
        assert ids == [f[:100] for f in full]
        assert truncated.tolist() == [len(f) > 100 for f in full]


# ---------------------------------------------------------------- text documents


def test_wikitext_titles_start_documents():
    docs = load_text_documents(WIKI)
    with open(WIKI, encoding="utf-8") as f:
        lines = f.readlines()
    titles = [line for line in lines if line.startswith(" = ") and not line.startswith(" = = ")]
    assert len(docs) == len(titles)
    assert docs[0].startswith("The 2013 – 14 season")
    assert not any(line.startswith("= ") or not line for d in docs for line in d.split("\n"))
    assert load_text_documents(WIKI, limit=3) == docs[:3]


def test_split_documents_plain_text_and_wikitext():
    assert split_documents(["a b\n", "c\n", "\n", "\n", "d\n"]) == ["a b\nc", "d"]
    wiki = [" \n", " = One = \n", " \n", " p1 \n", " = = Sub = = \n", " p2 \n", " = Two = \n", " q \n"]
    assert split_documents(wiki) == ["p1\np2", "q"]


def test_text_folder_picks_split_and_one_copy(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "wiki.train.tokens").write_text(" = T = \n train text \n")
    (tmp_path / "wiki.valid.tokens").write_text(" = V = \n valid text \n")
    (tmp_path / "wiki.valid.raw").write_text(" = V = \n valid text \n")
    assert load_text_documents(str(tmp_path)) == ["train text"]
    assert load_text_documents(str(tmp_path), split="val") == ["valid text"]


def test_folder_has_split(tmp_path):
    pairs, text, plain = tmp_path / "pairs", tmp_path / "text", tmp_path / "plain"
    for folder in (pairs, text, plain):
        folder.mkdir()
    shutil.copy(PTB, pairs / "train.jsonl.gz")
    (text / "wiki.train.tokens").write_text(" = T = \n train text \n")
    (plain / "corpus.txt").write_text("some text\n")  # no split names: nothing to pick
    assert not folder_has_split(str(pairs), "validation", pairs=True)
    assert not folder_has_split(str(text), "validation", pairs=False)
    assert not folder_has_split(str(plain), "validation", pairs=False)
    assert not folder_has_split(PTB, "validation", pairs=True)  # a file, not a folder
    shutil.copy(PTB, pairs / "val.jsonl.gz")
    (text / "wiki.valid.tokens").write_text(" = V = \n valid text \n")
    assert folder_has_split(str(pairs), "validation", pairs=True)
    assert folder_has_split(str(text), "val", pairs=False)
    assert not folder_has_split(str(text), "test", pairs=False)


def test_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_text_documents(str(tmp_path / "missing.txt"))
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(DataError, match="blank.txt"):
        load_text_documents(str(tmp_path / "blank.txt"))


# ---------------------------------------------------------------- MLM / NSP


def test_mlm_blocks_stay_inside_one_document():
    docs = numbered_docs([30, 5, 14, 3, 100])
    blocks = pack_mlm_blocks(docs, NumberTokenizer(), block_size=16)
    assert blocks.dtype == np.int32 and blocks.shape[1] == 16
    for row in blocks:
        assert row[0] == CLS
        body = row[1 : np.flatnonzero(row == SEP)[0]]
        assert len(body) >= 8 or len(body) == 14
        assert len({t // 1000 for t in body}) == 1  # one document per block
        assert (row[len(body) + 2 :] == PAD).all()
    # 30 -> 14+14 (+2 dropped), 5 dropped, 14 -> 14, 3 dropped, 100 -> 7x14 (+2 dropped)
    assert len(blocks) == 2 + 1 + 7


def test_mlm_blocks_real_tokenizer(tokenizer):
    docs = load_text_documents(WIKI)
    blocks = pack_mlm_blocks(docs, tokenizer, block_size=128)
    assert blocks.shape[1] == 128 and len(blocks) > 100
    assert (blocks[:, 0] == CLS).all() and ((blocks == SEP).sum(axis=1) == 1).all()
    with pytest.raises(DataError):
        pack_mlm_blocks(["a b"], tokenizer, block_size=128)


def test_nsp_pairs_half_true_and_segments_right():
    docs = numbered_docs([80, 60, 120, 40, 200])
    ids, seg, is_next = make_nsp_pairs(docs, NumberTokenizer(), 23, np.random.default_rng(0))
    assert ids.shape == seg.shape and ids.shape[1] == 23 and ids.dtype == seg.dtype == is_next.dtype == np.int32
    assert 0.35 < is_next.mean() < 0.65
    for row, s, nxt in zip(ids, seg, is_next):
        seps = np.flatnonzero(row == SEP)
        assert row[0] == CLS and len(seps) == 2
        a, b = row[1 : seps[0]], row[seps[0] + 1 : seps[1]]
        assert len(a) == 10 and 1 <= len(b) <= 10
        assert (s[: seps[0] + 1] == 0).all() and (s[seps[0] + 1 : seps[1] + 1] == 1).all() and (s[seps[1] + 1 :] == 0).all()
        if nxt:
            assert b[0] == a[-1] + 1  # the true continuation
        else:
            assert b[0] // 1000 != a[0] // 1000  # another document
    with pytest.raises(DataError):
        make_nsp_pairs(numbered_docs([50]), NumberTokenizer(), 23, np.random.default_rng(0))


# ---------------------------------------------------------------- batching


def test_bucketed_batches_deterministic_and_complete():
    lengths = np.random.default_rng(1).integers(5, 500, size=1003)
    a = bucketed_batches(lengths, 16, seed=3, epoch=2, bucket_size_multiplier=10)
    b = bucketed_batches(lengths, 16, seed=3, epoch=2, bucket_size_multiplier=10)
    c = bucketed_batches(lengths, 16, seed=3, epoch=3, bucket_size_multiplier=10)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    flat = np.concatenate(a)
    assert np.array_equal(np.sort(flat), np.arange(1003))  # every index exactly once
    assert all(len(x) == 16 for x in bucketed_batches(lengths, 16, 3, 2, drop_last=True))


def test_bucketing_reduces_padding():
    lengths = np.random.default_rng(2).integers(5, 500, size=2000)

    def padding(batches):
        return sum(len(x) * lengths[x].max() - lengths[x].sum() for x in batches)

    bucketed = bucketed_batches(lengths, 16, seed=0, epoch=0)
    shuffled = np.array_split(np.random.default_rng(0).permutation(2000), 125)
    assert padding(bucketed) < 0.25 * padding(shuffled)


def test_collate_pads_to_multiple():
    out = collate([np.array([1, 2, 3]), np.array([4] * 9, dtype=np.int32)], pad_id=0)
    assert out.shape == (2, 16) and out.dtype == np.int32
    assert out[0].tolist() == [1, 2, 3] + [0] * 13 and out[1, :9].tolist() == [4] * 9
    assert collate([np.array([1])], pad_id=7, pad_to_multiple=1).tolist() == [[1]]
    with pytest.raises(ValueError):
        collate([], pad_id=0)


def test_csv_and_jsonl_with_a_byte_order_mark(tmp_path):
    """Spreadsheet exports often start with a UTF-8 BOM: the first field name must still match."""
    from train.data import load_summarization_pairs

    csv_path = tmp_path / "pairs.csv"
    csv_path.write_text("article,highlights\nThe cat sat on the mat all day.,A cat sat.\n", encoding="utf-8-sig")
    jsonl_path = tmp_path / "pairs.jsonl"
    jsonl_path.write_text('{"article": "The dog ran far away.", "highlights": "A dog ran."}\n', encoding="utf-8-sig")
    for path in (csv_path, jsonl_path):
        pairs = load_summarization_pairs(str(path))
        assert len(pairs) == 1 and pairs.articles[0].startswith("The ")


def test_strip_update_labels_removes_cnns_new_label_from_each_line():
    from train.data import SummarizationData, strip_update_labels

    data = SummarizationData(
        ["a", "b", "c", "d"],
        [
            'new : " i thought i was going to die , " driver says .\nnew: truck was folded in half .',
            "NEW: Police say the fire is out.\nThe new: label is only a label at the start.",
            "brand new : shoes sell out .\nnewton : apples fall .",  # not labels
            "new :",  # nothing but a label: kept, not emptied
        ],
    )
    assert strip_update_labels(data) == 2
    assert data.summaries[0] == '" i thought i was going to die , " driver says .\ntruck was folded in half .'
    assert data.summaries[1] == "Police say the fire is out.\nThe new: label is only a label at the start."
    assert data.summaries[2:] == ["brand new : shoes sell out .\nnewton : apples fall .", "new :"]


def test_end_sentences_closes_unended_summary_lines_with_a_full_stop():
    from train.data import SummarizationData, end_sentences
    from b2b.text import detokenize, split_sentences

    data = SummarizationData(
        ["a", "b", "c", "d"],
        [
            'the filmmaker also did " grey gardens "\nhe died at 88 .',  # PTB: quote ends the line
            'He said: "I am fine."\nWhat next?\nWow!',  # already ended, inside or before quotes
            "the bank ( bp )\n\nraw text ends here ",  # a bracket, an empty line, trailing space
            "done . \"",  # PTB full stop before a spaced-off closing quote
        ],
    )
    assert end_sentences(data) == 2
    assert data.summaries[0] == 'the filmmaker also did " grey gardens " .\nhe died at 88 .'
    assert data.summaries[1] == 'He said: "I am fine."\nWhat next?\nWow!'
    assert data.summaries[2] == "the bank ( bp ) .\n\nraw text ends here ."
    assert data.summaries[3] == 'done . "'
    # What the model learns to write now splits where the highlights did.
    joined = detokenize(" ".join(data.summaries[0].split("\n")))
    assert split_sentences(joined) == ['The filmmaker also did "grey gardens".', "He died at 88."]


def test_each_trainer_names_the_other_for_the_wrong_kind_of_file():
    # Pairs given to pretraining, plain text given to fine-tuning: a sentence, not a JSON error.
    with pytest.raises(DataError, match="not plain text.*train.finetune"):
        load_text_documents(os.path.join(FIXTURES, "cnndm_sample.jsonl"))
    with pytest.raises(DataError, match="is plain text.*train.pretrain"):
        load_summarization_pairs(os.path.join(FIXTURES, "wikitext_sample.tokens"))
