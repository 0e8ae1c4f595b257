"""The one metric writer: every scalar and text of a run goes through `MetricWriter`, which fans
out to TensorBoard (tensorboardX) and to `metrics.jsonl` (what the demo reads live).

`metrics.jsonl` holds one JSON object per line: `{"step", "tag", "value", "time"}` for scalars,
`{"step", "tag", "text", "time"}` for texts. Both files reach the disk at least every
`flush_secs` (a background thread) and on `flush()`, so a reader sees a run's curve while it
goes on.
"""
from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import os
import threading
import time
from types import TracebackType

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SETTINGS_TAG = "run/settings"
_FILE_NUMBER = itertools.count()


class _EventFile:
    """A TensorBoard event file written synchronously with tensorboardX's building blocks.

    tensorboardX's `SummaryWriter` hands events to a background thread through a queue and its
    `flush()` does not wait for that queue, so a reader could miss the latest points; writing
    the events here makes `flush()` mean "on disk now". Not thread-safe: MetricWriter locks."""

    def __init__(self, log_dir: str, purge_step: int | None) -> None:
        from tensorboardX import summary
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self._summary, self._event = summary, Event
        # File names carry seconds only: a pid and counter keep two writers from clobbering.
        suffix = f".{os.getpid()}.{next(_FILE_NUMBER)}"
        self._writer = EventsWriter(os.path.join(log_dir, "events"), suffix)
        if purge_step is not None:  # TensorBoard hides older events at steps >= purge_step
            self._writer.write_event(
                Event(step=purge_step, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START))
            )
        self._dirty = False

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._write(self._summary.scalar(tag, value), step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._write(self._summary.text(tag, text), step)

    def _write(self, summary: object, step: int) -> None:
        self._writer.write_event(self._event(summary=summary, step=step, wall_time=time.time()))
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:  # the flush fsyncs: skip it when there is nothing new
            self._dirty = False
            self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MetricWriter:
    """Write scalars and texts to TensorBoard and `log_dir/metrics.jsonl`.

    An existing `metrics.jsonl` is appended to (a resumed run keeps its history); pass
    `purge_step` when resuming so TensorBoard also hides the events logged after that step by
    the interrupted run (`read_metrics` does the same for the JSONL)."""

    def __init__(
        self,
        log_dir: str,
        flush_secs: float = 2.0,
        use_tensorboard: bool = True,
        purge_step: int | None = None,
    ) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.log_dir = log_dir
        self.flush_secs = flush_secs
        self.path = os.path.join(log_dir, METRICS_FILE)
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._file = open(self.path, "a", encoding="utf-8")
        if self._file.tell() > 0 and not _ends_with_newline(self.path):
            # A crashed run may have left half a line; start ours on a fresh one.
            self._file.write("\n")
        self._tb = _EventFile(log_dir, purge_step) if use_tensorboard else None
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flush_periodically, name="metric-writer", daemon=True)
        self._thread.start()

    # -- writing -------------------------------------------------------------------------

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Record one number (a Python, numpy or 0-d mlx value) at `step`."""
        value, step = float(value), int(step)
        self._record({"step": step, "tag": tag, "value": value, "time": time.time()}, "scalar", value)

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        """Record several numbers at one step, e.g. `{"train/loss": 2.3, "train/lr": 1e-4}`."""
        for tag, value in metrics.items():
            self.scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Record a text (a sample summary, the settings) at `step`."""
        self._record({"step": int(step), "tag": tag, "text": str(text), "time": time.time()}, "text", str(text))

    def hparams(self, settings: dict) -> None:
        """Record the run's settings as JSON text under `run/settings` (step 0)."""
        body = json.dumps(settings, indent=2, sort_keys=True, default=str)
        # TensorBoard renders text as Markdown: indent so the JSON shows as a code block.
        markdown = "\n".join("    " + line for line in body.splitlines())
        self._record({"step": 0, "tag": SETTINGS_TAG, "text": body, "time": time.time()}, "text", markdown)

    def _record(self, entry: dict, kind: str, tb_value: float | str) -> None:
        """Queue `entry` for metrics.jsonl and write it to the event file."""
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            if self._closed:
                raise ValueError(f"The metric writer for {self.log_dir} is closed.")
            self._pending.append(line)
            if self._tb is not None:
                getattr(self._tb, kind)(entry["tag"], tb_value, entry["step"])

    # -- flushing ------------------------------------------------------------------------

    def flush(self) -> None:
        """Push everything recorded so far to disk (both files)."""
        with self._lock:
            if self._closed:
                return
            if self._pending:
                self._file.write("".join(self._pending))
                self._file.flush()
                self._pending.clear()
            if self._tb is not None:
                self._tb.flush()

    def _flush_periodically(self) -> None:
        while not self._stop.wait(self.flush_secs):
            self.flush()

    def close(self) -> None:
        """Flush and close; safe to call twice."""
        if self._closed:
            return
        self._stop.set()
        self._thread.join()
        self.flush()
        with self._lock:
            self._closed = True
            self._file.close()
            if self._tb is not None:
                self._tb.close()

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


# -- reading ---------------------------------------------------------------------------------


def _read_entries(path: str) -> list[dict]:
    """Entries of a metrics.jsonl (or of the one in a run folder); [] when it does not exist
    yet. Unparsable lines (the half-written last line of a live run) are skipped."""
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return []
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines):  # the last line is normal while a run writes; others are not
                log.warning("Skipping unreadable line %d of %s.", number, path)
            continue
        if isinstance(entry, dict) and "tag" in entry and "step" in entry:
            entries.append(entry)
    return entries


def _add(series: list, step: int, item: object) -> None:
    """Append, first dropping points at or after `step`: after a resume the file holds the
    interrupted run's later points, which the resumed run replaces."""
    if series and series[-1][0] >= step:
        del series[bisect.bisect_left([s for s, _ in series], step) :]
    series.append((step, item))


def read_metrics(path: str) -> dict[str, list[tuple[int, float]]]:
    """Scalar series by tag, `{"train/loss": [(step, value), ...]}`, from a metrics.jsonl or
    a run folder. Tolerates a half-written last line; {} if the file does not exist yet."""
    out: dict[str, list[tuple[int, float]]] = {}
    for entry in _read_entries(path):
        if "value" in entry:
            value = entry["value"]
            _add(out.setdefault(entry["tag"], []), int(entry["step"]), math.nan if value is None else float(value))
    return out


def read_run_starts(path: str) -> list[dict]:
    """What each start of a run recorded under `run/settings` (settings, model, runtime), oldest
    first: a resumed run has one per start, all at step 0, which read_texts would merge."""
    starts = []
    for entry in _read_entries(path):
        if entry["tag"] == SETTINGS_TAG:
            try:
                record = json.loads(entry.get("text") or "")
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                starts.append(record)
    return starts


def read_texts(path: str) -> dict[str, list[tuple[int, str]]]:
    """Text entries by tag, `{"val/sample": [(step, text), ...]}` (same rules as read_metrics)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for entry in _read_entries(path):
        if "text" in entry:
            _add(out.setdefault(entry["tag"], []), int(entry["step"]), str(entry["text"]))
    return out
