"""The checkpoint store: which model the app serves, and hot reload.

The store scans a watch root (default `logs/`) for complete checkpoints, serves the newest,
and swaps a newer one in from a background poller without a restart. A request calls
`current()` once and keeps that `Served` to its end, so a swap never changes the model under
a request in flight (the old model lives until its last request drops it). A checkpoint that
fails to load is remembered and skipped (the old model keeps serving) and `warning` says so
until a newer checkpoint loads. `pinned` serves one folder only (reloaded if it is rewritten).
With nothing under the watch root, the shipped `demo/checkpoint/` is served if present."""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from b2b import DECODING_FILE, Bert2Bert, Tokenizer, is_checkpoint
from train.checkpoints import load_for_decoding
from train.lineage import lineage_of, totals

from .worker import ModelWorker

log = logging.getLogger(__name__)

BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint")
_STEP = re.compile(r"step_(\d+)$")
SERVED_TASK = "summarization"  # trainer_state.json "task" of checkpoints worth serving
_MAX_DEPTH = 4  # logs/RUN/checkpoints/step_N is three levels down


def train_hint(watch_root: str = "logs") -> str:
    """The command that trains a small model (a few minutes on a laptop, bundled sample data)
    into a folder under `watch_root`, where the app and the CLI look for checkpoints."""
    out = os.path.join(watch_root, "quick")
    return f"python -m train.finetune --preset tiny --max-steps 200 --save-every 50 --out {out}"


TRAIN_FULL = (
    "python -m train.finetune --init ../shared/models/minilm-l6-h384-uncased "
    "--data ../shared/data/cnndm/train.jsonl.gz --val-data ../shared/data/cnndm/val.jsonl.gz --out logs/cnndm"
)


class NoCheckpoint(ValueError):
    """Nothing is served yet; the message says how to get a checkpoint."""


@dataclass(frozen=True)
class Candidate:
    """A complete checkpoint folder found on disk."""

    path: str
    mtime: float  # of its weights file: when it was written
    signature: tuple  # changes when the folder is rewritten
    step: int | None
    source: str  # "pinned", "watch" or "bundled"

    @property
    def key(self) -> tuple:
        return (self.mtime, self.step or 0)


@dataclass(frozen=True)
class Served:
    """A loaded model and what the UI says about it. Immutable: a swap makes a new one."""

    model: Bert2Bert
    tokenizer: Tokenizer
    candidate: Candidate
    loaded_at: float
    trainer_state: dict = field(default_factory=dict)
    num_parameters: int = 0

    @property
    def path(self) -> str:
        return self.candidate.path

    @property
    def identity(self) -> tuple:
        """Which weights these are: changes with every swap, a rewritten folder included."""
        return (self.candidate.path, self.candidate.signature, self.loaded_at)

    @property
    def step(self) -> int | None:
        return self.trainer_state.get("step", self.candidate.step)

    @property
    def run_dir(self) -> str | None:
        """`logs/RUN` for `logs/RUN/checkpoints/step_N`; None for a loose checkpoint folder."""
        parent = os.path.dirname(self.path)
        return os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else None

    @property
    def run(self) -> str:
        return os.path.basename(self.run_dir) if self.run_dir else os.path.basename(self.path)

    @property
    def val_metrics(self) -> dict[str, float]:
        """The validation scores the trainer recorded for this checkpoint (may be empty)."""
        last = self.trainer_state.get("last_eval") or {}
        return {k: v for k, v in last.items() if k.startswith("val/") and isinstance(v, (int, float))}

    @cached_property
    def test_report(self) -> dict | None:
        """The `train.evaluate` report kept beside the weights (`eval_*.json`) with the most
        articles, beam search preferred, among plain-decoding ones (no repetition penalty) when
        there are any: what the header quotes. None when there is none."""
        best, rank = None, None
        for name in sorted(os.listdir(self.path)) if os.path.isdir(self.path) else []:
            if not (name.startswith("eval_") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.path, name), encoding="utf-8") as f:
                    report = json.load(f)
                float(report["model"]["rouge2"]), float(report["model"]["rougeLsum"])  # what `measured` quotes
                plain = float(report["settings"].get("repetition_penalty", 1.0)) == 1.0
                key = (plain, int(report["n"]), int(report["settings"]["num_beams"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a hand-edited or foreign file: the header simply does not quote it
            if rank is None or key > rank:
                best, rank = report, key
        return best

    @cached_property
    def lineage(self) -> list[dict]:
        """The runs that made these weights, oldest first (`train.lineage`); [] when unrecorded."""
        try:
            return lineage_of(self.path)
        except (OSError, ValueError, KeyError, TypeError):  # a hand-edited file: say nothing rather than fail
            return []

    def trained(self) -> str | None:
        """`trained 20,546 steps (412,944 examples) in 10 runs` for weights made by several runs, else None."""
        runs = self.lineage
        if len(runs) < 2:
            return None
        total = totals(runs)
        return f"trained {total['steps']:,} steps ({total['examples']:,} examples) in {len(runs)} runs"

    def measured(self) -> str | None:
        """One sentence quoting `test_report` (with Lead-3 when it has it), or None."""
        report = self.test_report
        if report is None:
            return None
        m, lead = report["model"], report.get("lead3") or {}
        versus = f" (Lead-3: {lead['rouge2']:.1f} / {lead['rougeLsum']:.1f})" if "rouge2" in lead else ""
        return (
            f"Measured on {report['n']:,} test articles, beam {report['settings']['num_beams']}: "
            f"ROUGE-2 {m['rouge2']:.1f} / ROUGE-Lsum {m['rougeLsum']:.1f}{versus}"
        )

    def config_summary(self) -> dict:
        c = self.model.config
        return {
            "hidden_size": c.hidden_size,
            "encoder_layers": c.encoder_layers,
            "decoder_layers": c.decoder_layers,
            "num_heads": c.num_heads,
            "ffn_size": c.ffn_size,
            "vocab_size": c.vocab_size,
            "max_positions": c.max_positions,
            "source_length": self.model.source_limit,  # what summaries read by default (the trained length)
            "share_encoder_decoder": c.share_encoder_decoder,
            "pointer_generator": c.pointer_generator,
            "parameters": self.num_parameters,
        }

    def headline(self) -> str:
        """`run cnndm, step 1200` — one line for the header and the CLI."""
        step = f", step {self.step}" if self.step is not None else ""
        where = {"bundled": " (bundled)", "pinned": " (pinned)"}.get(self.candidate.source, "")
        return f"{self.run}{step}{where}"


def _step_of(path: str) -> int | None:
    m = _STEP.search(os.path.basename(path.rstrip("/")))
    return int(m.group(1)) if m else None


def _candidate(path: str, source: str) -> Candidate | None:
    """Describe a checkpoint folder, or None when it is not a complete one (or vanished), or
    when its trainer_state.json says it comes from another task (an MLM pre-training run
    cannot summarize) unless it was pinned by hand."""
    if not is_checkpoint(path):
        return None
    task = _trainer_state(path).get("task") or SERVED_TASK
    if task != SERVED_TASK and source != "pinned":
        return None
    try:
        w = os.stat(os.path.join(path, "model.safetensors"))
        c = os.stat(os.path.join(path, "config.json"))
    except OSError:  # pruned between the check and the stat
        return None
    try:  # how much source it reads: a decoding.json added or edited is a new version too
        d = os.stat(os.path.join(path, DECODING_FILE))
        decoding = (d.st_mtime_ns, d.st_size)
    except OSError:
        decoding = None
    signature = (w.st_mtime_ns, w.st_size, c.st_mtime_ns, c.st_size, decoding)
    return Candidate(os.path.abspath(path), w.st_mtime, signature, _step_of(path), source)


def find_checkpoints(root: str, source: str = "watch") -> list[Candidate]:
    """Complete summarization checkpoints under `root` (or `root` itself), newest first.
    Folders being written (`.tmp`) or replaced (`.old`) are skipped, and so are pre-training
    checkpoints; a checkpoint's own subfolders are not searched."""
    found: list[Candidate] = []
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        return found
    base_depth = root.rstrip(os.sep).count(os.sep)
    for folder, subdirs, _ in os.walk(root):
        cand = _candidate(folder, source)
        if cand is not None:
            found.append(cand)
            subdirs[:] = []
            continue
        if folder.count(os.sep) - base_depth >= _MAX_DEPTH:
            subdirs[:] = []
        subdirs[:] = sorted(d for d in subdirs if not d.endswith((".tmp", ".old")) and not d.startswith("."))
    return sorted(found, key=lambda c: c.key, reverse=True)


class CheckpointStore:
    """Finds, loads and hot-swaps the served checkpoint. Thread-safe."""

    def __init__(
        self,
        watch_root: str | None = "logs",
        pinned: str | None = None,
        fallback: str | None = BUNDLED,
        worker: ModelWorker | None = None,
        poll_seconds: float = 5.0,
        settle_seconds: float = 1.0,
        loader: Callable[[str], tuple[Bert2Bert, Tokenizer]] = load_for_decoding,
    ) -> None:
        self.watch_root = watch_root
        self.pinned = os.path.abspath(pinned) if pinned else None
        self.fallback = fallback
        self.worker = worker or ModelWorker(inline=True)
        self.poll_seconds = poll_seconds
        self.settle_seconds = settle_seconds  # a file written this recently may still be growing
        self._loader = loader
        self._served: Served | None = None
        self._failed: dict[tuple, tuple[Candidate, str]] = {}  # (path, signature) -> why
        self._swap_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swaps = 0
        self._gone: str | None = None  # the served folder, once seen deleted (logged once)

    # -- what requests use ---------------------------------------------------------------

    def current(self) -> Served | None:
        """The served model; keep the returned object for the whole request."""
        with self._swap_lock:
            return self._served

    def require(self) -> Served:
        """The served model, or NoCheckpoint with a sentence saying how to get one."""
        served = self.current()
        if served is None:
            raise NoCheckpoint(
                f"No checkpoint is loaded yet: train one with {self.train_hint} "
                "(new checkpoints are picked up by themselves) or pass --checkpoint DIR."
            )
        return served

    @property
    def train_hint(self) -> str:
        """The command that trains a small model where this store looks."""
        return train_hint(self.watch_root or "logs")

    @property
    def warning(self) -> str | None:
        """Why a checkpoint newer than the served one is not served, or None."""
        served = self.current()
        with self._swap_lock:
            failed = list(self._failed.values())
        if self.pinned and not is_checkpoint(self.pinned) and served is None:
            return f"--checkpoint {self.pinned} is not a complete checkpoint folder (it needs model.safetensors and config.json)."
        newer = [(c, why) for c, why in failed if served is None or _better(c, served.candidate)]
        if not newer:
            return None
        cand, why = max(newer, key=lambda cw: cw[0].key)
        keep = f"still serving {served.headline()}" if served else "no model is served"
        return f"Skipped the checkpoint {cand.path} ({why}); {keep}."

    # -- scanning and loading ------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Checkpoints that may be served, best first."""
        if self.pinned:
            cand = _candidate(self.pinned, "pinned")
            return [cand] if cand else []
        found = find_checkpoints(self.watch_root, "watch") if self.watch_root else []
        if not found and self.fallback:
            cand = _candidate(self.fallback, "bundled")
            found = [cand] if cand else []
        return found

    def refresh(self) -> bool:
        """Scan once; load and swap in the best checkpoint that is newer than the served one.
        True when the served model changed."""
        with self._refresh_lock:
            served = self.current()
            if served is not None and not self.pinned and not is_checkpoint(served.path):
                # Deleted (a test run removed, a run pruned): any remaining checkpoint, or the
                # bundled one, replaces it; with none, its weights stay in memory and serve on.
                if self._gone != served.path:
                    log.info("The served checkpoint %s is gone; looking for another.", served.path)
                    self._gone = served.path
                served = None
            now = time.time()
            for cand in self.candidates():  # best first
                if served is not None and not _better(cand, served.candidate):
                    return False  # nor is any after it
                if (cand.path, cand.signature) in self._failed:
                    continue
                if now - cand.mtime < self.settle_seconds:
                    return False  # maybe still being copied in: look again next time
                if self._load(cand):
                    return True
            return False

    def _load(self, cand: Candidate) -> bool:
        try:
            model, tokenizer, size = self.worker.run(_load_and_count, self._loader, cand.path)
        except (ValueError, OSError, KeyError, RuntimeError) as e:  # CheckpointError is a ValueError
            if not os.path.isdir(cand.path):
                log.info("Checkpoint %s was removed while loading; ignoring it.", cand.path)
                return False
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            why = why.replace(cand.path + os.sep, "").replace(cand.path, "the folder")
            log.warning("Skipping checkpoint %s: %s", cand.path, why)
            with self._swap_lock:
                self._failed[(cand.path, cand.signature)] = (cand, why)
            return False
        served = Served(model, tokenizer, cand, time.time(), _trainer_state(cand.path), size)
        with self._swap_lock:
            old, self._served = self._served, served
            self.swaps += 1
        log.info("Serving %s (%s)%s.", served.headline(), cand.path, f", replacing {old.headline()}" if old else "")
        return True

    # -- the poller ----------------------------------------------------------------------

    def start(self) -> "CheckpointStore":
        """Load what there is now, then keep watching in a daemon thread."""
        self._safe_refresh()
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="checkpoint-poller", daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self._safe_refresh()

    def _safe_refresh(self) -> None:
        try:
            self.refresh()
        except Exception:  # noqa: BLE001 - the poller must outlive any surprise; it is logged
            log.exception("Checkpoint scan failed; the served model is unchanged.")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # -- description ---------------------------------------------------------------------

    def info(self) -> dict:
        """What `model_info` returns: the checkpoint, its step, config and the runtime."""
        from b2b import runtime_info

        served = self.current()
        runtime = runtime_info()
        out = {
            "status": "serving" if served else "no checkpoint",
            "checkpoint": served.path if served else None,
            "source": served.candidate.source if served else None,
            "run": served.run if served else None,
            "step": served.step if served else None,
            "loaded_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(served.loaded_at)) if served else None,
            "val_metrics": served.val_metrics if served else {},
            "config": served.config_summary() if served else None,
            "watch_root": os.path.abspath(self.watch_root) if self.watch_root and not self.pinned else None,
            "pinned": self.pinned,
            "warning": self.warning,
            "blas": runtime["blas"],
            "runtime": runtime,
        }
        if served is None:
            out["how_to_get_one"] = self.train_hint
        return out


def _load_and_count(loader: Callable, path: str) -> tuple[Bert2Bert, Tokenizer, int]:
    """Runs on the model worker: load, and count the parameters once."""
    from mlx.utils import tree_flatten

    model, tokenizer = loader(path)
    return model, tokenizer, int(sum(v.size for _, v in tree_flatten(model.parameters())))


def _better(cand: Candidate, current: Candidate) -> bool:
    """Should `cand` replace the served `current`? A rewritten folder, or a newer one of the
    same kind; anything from the watch root beats the bundled fallback."""
    if cand.path == current.path:
        return cand.signature != current.signature
    if cand.source != current.source:
        return current.source == "bundled"
    return cand.key > current.key


def _trainer_state(path: str) -> dict:
    """trainer_state.json of a run checkpoint; {} for other folders or an unreadable file."""
    try:
        with open(os.path.join(path, "trainer_state.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
