"""The checkpoint store: newest complete checkpoint, hot swap, corrupt ones skipped, pinning,
the bundled fallback, and the single MLX worker thread."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest

from b2b import DECODING_FILE, B2BConfig, Bert2Bert, Tokenizer, save_checkpoint, summarize
from demo.store import CheckpointStore, NoCheckpoint, find_checkpoints
from demo.worker import ModelWorker


@pytest.fixture(scope="module")
def tiny_pair():
    return Bert2Bert(B2BConfig.preset("tiny")), Tokenizer.default()


def write_ckpt(tiny_pair, root, step: int, age: float = 0.0, run: str = "run", corrupt: bool = False) -> str:
    """A tiny run checkpoint `root/run/checkpoints/step_N` whose files look `age` s old;
    `corrupt` cuts its weights file short."""
    path = os.path.join(root, run, "checkpoints", f"step_{step:07d}")
    save_checkpoint(*tiny_pair, path, extra={"trainer_state.json": {"step": step, "last_eval": {"val/rouge2": step / 10}}})
    if corrupt:
        with open(os.path.join(path, "model.safetensors"), "r+b") as f:
            f.truncate(100)
    stamp = time.time() - age
    for name in os.listdir(path):
        os.utime(os.path.join(path, name), (stamp, stamp))
    return path


def store_for(root, **kw) -> CheckpointStore:
    kw.setdefault("fallback", None)
    kw.setdefault("settle_seconds", 0.0)
    return CheckpointStore(str(root), **kw)


def test_no_checkpoint_is_a_normal_state(tmp_path):
    store = store_for(tmp_path)
    assert store.refresh() is False
    assert store.current() is None
    with pytest.raises(NoCheckpoint, match="train.finetune"):
        store.require()
    info = store.info()
    assert info["status"] == "no checkpoint" and info["checkpoint"] is None and "blas" in info


def test_serves_the_newest_and_swaps_without_breaking_a_request(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10, age=100)
    store = store_for(tmp_path)
    assert store.refresh()
    held = store.current()  # a request in flight holds this
    assert held.step == 10 and held.run == "run" and held.val_metrics == {"val/rouge2": 1.0}

    write_ckpt(tiny_pair, tmp_path, 20, age=50)
    assert store.refresh()
    assert store.current().step == 20
    assert store.refresh() is False  # nothing newer
    # The old model still answers for the request that took it before the swap.
    assert summarize(held.model, held.tokenizer, "The cat sat.", max_length=4).num_tokens <= 4
    assert store.info()["step"] == 20 and store.info()["config"]["hidden_size"] == 32


def test_corrupt_or_half_written_checkpoints_are_skipped(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10, age=100)
    store = store_for(tmp_path)
    store.refresh()

    bad = write_ckpt(tiny_pair, tmp_path, 30, age=50, corrupt=True)
    half = os.path.join(tmp_path, "run", "checkpoints", "step_0000040.tmp")  # being written
    shutil.copytree(bad, half)
    no_weights = write_ckpt(tiny_pair, tmp_path, 45, age=40)
    os.remove(os.path.join(no_weights, "model.safetensors"))

    assert store.refresh() is False
    assert store.current().step == 10  # the old model keeps serving
    assert "step_0000030" in store.warning and "still serving run, step 10" in store.warning
    assert store.refresh() is False  # the failure is remembered, not retried every scan

    write_ckpt(tiny_pair, tmp_path, 50, age=10)
    assert store.refresh()
    assert store.current().step == 50 and store.warning is None


def test_pretraining_checkpoints_are_not_served(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10, age=100)
    mlm = os.path.join(tmp_path, "mlm", "checkpoints", "step_0000050")
    save_checkpoint(*tiny_pair, mlm, extra={"trainer_state.json": {"task": "mlm", "step": 50}})
    store = store_for(tmp_path)
    store.refresh()
    assert store.current().step == 10
    pinned = store_for(tmp_path, pinned=mlm)  # by hand, it is served anyway
    assert pinned.refresh() and pinned.current().step == 50


def test_find_checkpoints_orders_newest_first_and_ignores_tmp(tmp_path, tiny_pair):
    a = write_ckpt(tiny_pair, tmp_path, 5, age=30, run="a")
    b = write_ckpt(tiny_pair, tmp_path, 1, age=10, run="b")
    shutil.copytree(a, a + ".tmp")
    assert [c.path for c in find_checkpoints(str(tmp_path))] == [b, a]


def test_pinned_checkpoint_is_served_and_reloaded_when_rewritten(tmp_path, tiny_pair):
    pinned = write_ckpt(tiny_pair, tmp_path, 10, age=100)
    write_ckpt(tiny_pair, tmp_path, 20, age=10)
    store = store_for(tmp_path, pinned=pinned)
    assert store.refresh() and store.current().step == 10
    assert store.current().candidate.source == "pinned"
    assert store.refresh() is False
    write_ckpt(tiny_pair, tmp_path, 10, age=1)  # rewritten in place
    assert store.refresh() and store.current().step == 10


def test_missing_pinned_folder_says_so(tmp_path):
    store = store_for(tmp_path, pinned=str(tmp_path / "nope"))
    store.refresh()
    assert "is not a complete checkpoint" in store.warning


def test_bundled_fallback_until_training_writes_one(tmp_path, tiny_pair):
    bundled = write_ckpt(tiny_pair, tmp_path / "shipped", 7)
    watch = tmp_path / "logs"
    watch.mkdir()
    store = store_for(watch, fallback=bundled)
    assert store.refresh() and store.current().candidate.source == "bundled"
    write_ckpt(tiny_pair, watch, 1, age=1000)  # older files, but from the watched run
    assert store.refresh() and store.current().candidate.source == "watch"


def test_deleting_the_served_checkpoint_falls_back_to_what_remains(tmp_path, tiny_pair):
    bundled = write_ckpt(tiny_pair, tmp_path / "shipped", 7)
    watch = tmp_path / "logs"
    older = write_ckpt(tiny_pair, watch, 1, age=1000, run="a")
    newer = write_ckpt(tiny_pair, watch, 3, run="b")
    store = store_for(watch, fallback=bundled)
    assert store.refresh() and store.current().path == newer
    shutil.rmtree(watch / "b")  # e.g. a tiny test run, deleted
    assert store.refresh() and store.current().path == older
    shutil.rmtree(watch / "a")
    assert store.refresh() and store.current().candidate.source == "bundled"
    shutil.rmtree(tmp_path / "shipped")  # nothing left: the weights in memory serve on
    assert store.refresh() is False and store.current().path == bundled
    assert store.info()["status"] == "serving"


def test_a_checkpoint_pruned_while_loading_is_ignored_quietly(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10)

    def loader(p):
        shutil.rmtree(p)
        raise FileNotFoundError(p)

    store = store_for(tmp_path, loader=loader)
    assert store.refresh() is False
    assert store.warning is None


def test_fresh_files_wait_to_settle(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10)
    store = store_for(tmp_path, settle_seconds=60)
    assert store.refresh() is False and store.current() is None


def test_poller_swaps_in_a_new_checkpoint_on_the_worker_thread(tmp_path, tiny_pair):
    write_ckpt(tiny_pair, tmp_path, 10, age=100)
    worker = ModelWorker()
    store = store_for(tmp_path, worker=worker, poll_seconds=0.1).start()
    try:
        assert store.current().step == 10
        write_ckpt(tiny_pair, tmp_path, 20, age=5)
        deadline = time.time() + 20
        while store.current().step != 20 and time.time() < deadline:
            time.sleep(0.1)
        assert store.current().step == 20
        served = store.current()
        text = worker.run(lambda: summarize(served.model, served.tokenizer, "Hello there.", max_length=3).text)
        assert isinstance(text, str)
    finally:
        store.stop()
        worker.close()


def test_worker_runs_calls_and_generators_and_passes_errors_back():
    worker = ModelWorker()
    try:
        names = worker.run(lambda: threading.current_thread().name)
        assert names == "mlx-worker"
        assert list(worker.iterate(lambda: iter(range(3)))) == [0, 1, 2]
        with pytest.raises(ZeroDivisionError):
            worker.run(lambda: 1 / 0)
        gen = worker.iterate(lambda: iter(range(10)))
        assert next(gen) == 0
        gen.close()  # a client that went away
        assert worker.run(lambda: 5) == 5
    finally:
        worker.close()
    inline = ModelWorker(inline=True)
    assert list(inline.iterate(lambda: iter("ab"))) == ["a", "b"]


def test_closing_a_stream_does_not_wait_for_the_busy_worker():
    worker = ModelWorker()
    closed = threading.Event()
    release = threading.Event()

    def stream():
        try:
            yield 1
            yield 2
        finally:
            closed.set()  # runs on the worker, once it is free

    try:
        gen = worker.iterate(stream)
        assert next(gen) == 1
        busy = worker.submit(lambda: release.wait(5))  # a long decoding step or ROUGE batch
        start = time.monotonic()
        gen.close()  # Stop, maybe from Gradio's event loop
        assert time.monotonic() - start < 1.0 and not closed.is_set()
        release.set()
        busy.result(5)
        assert closed.wait(5)  # closed where it ran, right after
    finally:
        release.set()
        worker.close()


def test_interactive_work_overtakes_a_background_evaluation():
    worker = ModelWorker()
    order = []
    started = threading.Event()

    def evaluation():
        started.set()
        for batch in range(3):
            time.sleep(0.1)
            order.append(f"batch {batch}")
            worker.yield_to_interactive()  # what the ROUGE tab does between batches

    try:
        done = worker.submit(evaluation, background=True)
        started.wait(5)
        summary = worker.submit(lambda: order.append("summary"))
        summary.result(5)
        done.result(5)
        assert order.index("summary") < order.index("batch 2")  # not after the whole evaluation
    finally:
        worker.close()


def test_a_summary_in_flight_finishes_on_the_model_it_started_with(tmp_path, tiny_pair):
    from demo.tab_summarize import summarize_stream
    from demo.validate import SUMMARIZE_DEFAULTS

    first = write_ckpt(tiny_pair, tmp_path, 10, age=100)
    store = store_for(tmp_path)
    store.refresh()
    decoding = [dict(SUMMARIZE_DEFAULTS, min_length=6, max_length=6)[k] for k in SUMMARIZE_DEFAULTS]
    stream = summarize_stream(store, "The river rose overnight and flooded the old town.", *decoding)
    next(stream), next(stream)  # generation has started
    write_ckpt(tiny_pair, tmp_path, 20, age=1)
    assert store.refresh() and store.current().step == 20  # swapped mid-request
    *_, (summary, stats, state) = stream
    assert state["checkpoint"] == first and "tokens/s" in stats


def test_a_decoding_file_added_beside_the_weights_is_reloaded(tmp_path, tiny_pair):
    path = write_ckpt(tiny_pair, tmp_path, 10, age=100)
    store = store_for(tmp_path)
    assert store.refresh() and store.current().model.source_limit == tiny_pair[0].config.max_positions
    with open(os.path.join(path, DECODING_FILE), "w") as f:
        json.dump({"max_source_length": 16}, f)
    assert store.refresh() and store.current().model.source_limit == 16


def test_the_header_totals_the_runs_behind_an_exported_model(tmp_path, tiny_pair):
    from demo.ui import header_markdown
    from train.lineage import LINEAGE

    folder = save_checkpoint(*tiny_pair, str(tmp_path / "shipped"))
    store = store_for(tmp_path, pinned=folder)
    store.refresh()
    assert store.require().trained() is None and "trained" not in header_markdown(store)  # nothing recorded

    runs = [{"run": "a", "steps": 1000, "examples": 16000}, {"run": "b", "steps": 234, "examples": 7488}]
    with open(os.path.join(folder, LINEAGE), "w") as f:
        json.dump(runs, f)
    store = store_for(tmp_path, pinned=folder)
    store.refresh()
    assert "trained 1,234 steps (23,488 examples) in 2 runs" in header_markdown(store)

    with open(os.path.join(folder, LINEAGE), "w") as f:
        f.write("[{broken")
    store = store_for(tmp_path, pinned=folder)
    store.refresh()
    assert store.require().trained() is None  # a broken file: said nothing, served anyway
