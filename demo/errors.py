"""The UI boundary: exceptions from handlers become `gr.Error` with one sentence.

Bad input (`BadInput`, b2b's `InputError`/`DecodingError`, train's `DataError`, a missing
checkpoint) is a ValueError or FileNotFoundError whose message is already a sentence; anything
else is a bug, logged with its traceback on the server while the user sees one line and the
app keeps serving."""
from __future__ import annotations

import functools
import inspect
import logging
import re
from typing import Callable

import gradio as gr

log = logging.getLogger(__name__)
_UPLOAD_DIR = re.compile(r"(?:/[^\s/]+)*/gradio/[0-9a-f]{16,}/")
USER_ERRORS = (ValueError, FileNotFoundError)


def sentence(error: BaseException) -> str:
    """The first line of an error's message, as one sentence."""
    if isinstance(error, UnicodeDecodeError):
        return "The input is not UTF-8 text."
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = text.strip().strip("'\"")
    # Uploads live in Gradio's cache (/tmp/gradio/<hash>/name.jsonl): the user knows the name.
    text = _UPLOAD_DIR.sub("", text)
    if len(text) > 400:
        text = text[:397] + "..."
    return text if text.endswith((".", "!", "?")) else text + "."


def as_gr_error(error: BaseException, what: str) -> gr.Error:
    if isinstance(error, gr.Error):
        return error
    if isinstance(error, USER_ERRORS):
        return gr.Error(sentence(error), print_exception=False)
    log.exception("Unexpected error while %s.", what)
    return gr.Error(f"Something went wrong while {what} ({type(error).__name__}); the details are in the server log.")


def ui_errors(what: str) -> Callable:
    """Decorate a handler (plain or generator) so that errors reach the UI as one sentence;
    `what` completes "Something went wrong while ...". The signature is kept (gradio reads
    it for gr.Progress parameters)."""

    def decorate(fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen_wrapper(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except GeneratorExit:
                    raise
                except Exception as e:  # noqa: BLE001 - the boundary: see as_gr_error
                    raise as_gr_error(e, what) from None

            return gen_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the boundary: see as_gr_error
                raise as_gr_error(e, what) from None

        return wrapper

    return decorate
