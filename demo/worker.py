"""One thread for all MLX work of the app.

MLX keeps its streams per thread: an array built lazily on one thread cannot be evaluated on
another, and a process whose MLX work ran on several threads at once aborts at exit. Gradio
runs handlers (and each step of a streaming handler) on a pool of threads, and the checkpoint
store loads new weights in the background. So every model call, weight load included, goes
through one `ModelWorker`: calls run one at a time on its thread. Steps of two streaming
requests interleave, so neither waits for the other to finish.

Long batch work (a ROUGE evaluation) is submitted with `background=True` and calls
`yield_to_interactive()` between its batches: summaries, attention maps and checkpoint loads
waiting at that moment run first, so one evaluation does not freeze everyone's summaries.

`ModelWorker(inline=True)` runs everything on the caller's thread (the CLI, unit tests)."""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()
GRACE_SECONDS = 0.02  # a streaming request submits its next step within this after the last


class ModelWorker:
    """Run callables on a single daemon thread (or inline) and hand back their results."""

    def __init__(self, inline: bool = False, name: str = "mlx-worker") -> None:
        self.inline = inline
        self._interactive: collections.deque = collections.deque()
        self._background: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if not inline:
            self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
            self._thread.start()

    # -- the worker thread ---------------------------------------------------------------

    @staticmethod
    def _run_job(job) -> None:
        fn, args, kwargs, fut = job
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to the caller, who re-raises it
            fut.set_exception(e)

    def _next_interactive(self, wait: float):
        """An interactive job, waiting up to `wait` seconds for one; None if none came."""
        deadline = time.monotonic() + wait
        with self._cond:
            while not self._interactive:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(left)
            return self._interactive.popleft()

    def _serve(self) -> None:
        just_ran_interactive = False
        while True:
            job = self._next_interactive(GRACE_SECONDS if just_ran_interactive else 0.0)
            if job is not None:
                self._run_job(job)
                just_ran_interactive = True
                continue
            just_ran_interactive = False
            with self._cond:
                while not (self._interactive or self._background or self._closed):
                    self._cond.wait()
                if self._interactive:
                    continue
                if self._background:
                    job = self._background.popleft()
                elif self._closed:
                    return
            self._run_job(job)

    def yield_to_interactive(self) -> None:
        """From inside a background job: run the interactive jobs waiting now (and those that
        follow within a moment), then return to the caller's work."""
        if self.inline or threading.current_thread() is not self._thread:
            return
        while (job := self._next_interactive(GRACE_SECONDS)) is not None:
            self._run_job(job)

    # -- callers -------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], *args, background: bool = False, **kwargs) -> "Future[T]":
        """Queue `fn(*args, **kwargs)`; a Future of its result. `background` jobs wait while
        interactive ones are queued."""
        fut: Future = Future()
        if self.inline:
            self._run_job((fn, args, kwargs, fut))
            return fut
        with self._cond:
            if self._closed:
                raise RuntimeError("The model worker is closed.")
            (self._background if background else self._interactive).append((fn, args, kwargs, fut))
            self._cond.notify()
        return fut

    def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`fn(*args, **kwargs)` on the worker thread; waits and returns (or raises) its result."""
        return self.submit(fn, *args, **kwargs).result()

    def iterate(self, make: Callable[[], Iterator[T]]) -> Iterator[T]:
        """Iterate the generator `make()` with every step (its creation too) on the worker."""
        if self.inline:
            yield from make()
            return
        it = self.run(make)

        def step():
            return next(it, _DONE)

        try:
            while True:
                item = self.run(step)
                if item is _DONE:
                    return
                yield item
        finally:  # a client that went away (or Stop): close the generator where it ran
            close = getattr(it, "close", None)
            if close is not None:
                # Queued, not awaited: Gradio may close from its event loop, which must not
                # wait for a decoding step or a ROUGE batch to finish.
                with contextlib.suppress(RuntimeError):  # the worker closed: nothing runs it any more
                    self.submit(close)

    def close(self) -> None:
        """Let the thread finish the queued jobs and stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
