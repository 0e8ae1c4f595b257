"""Summarize from the terminal with the model the app would serve.

    python -m demo.cli [--checkpoint DIR | --watch logs] [--text TEXT | --file PATH] [decoding flags]

Without --text/--file it opens a prompt: an article typed or pasted there, ended by an empty
line, is summarized (blank lines inside a paste do not end it), `>file PATH` summarizes a file,
`>eval [N]` runs ROUGE on the bundled CNN/DM sample (model vs Lead-3), `>exit` quits."""
from __future__ import annotations

import argparse
import logging
import select
import sys
from typing import Callable

from b2b import summarize  # (demo/__init__ imported b2b first: the fast BLAS is loaded)

from .data import SAMPLE_SET, SAMPLE_SIZE
from .store import BUNDLED, CheckpointStore, NoCheckpoint, Served, train_hint
from .validate import (
    DECODING_FIELDS, SUMMARIZE_DEFAULTS, BadInput, decoding_kwargs, parse_flag, read_text_file, readable_text,
)

PROMPT, MORE = "b2b> ", "...> "
HELP = "Type or paste an article, then press Enter on an empty line to summarize it · >file PATH · >eval [N] · >exit"
PASTE_WAIT = 0.05  # seconds: the lines of a paste reach the terminal together, typed ones do not


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--checkpoint", metavar="DIR", help="checkpoint folder to use")
    where.add_argument("--watch", default="logs", help="use the newest checkpoint under this folder (default: logs)")
    p.add_argument("--fallback", default=BUNDLED, metavar="DIR",
                       help="used while --watch has no checkpoint ('' for none; default: demo/checkpoint)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--text", help="summarize this text and exit")
    what.add_argument("--file", help="summarize this .txt/.md file and exit")
    dec = p.add_argument_group("decoding (as in the app)")
    dec.add_argument("--strategy", choices=["beam", "greedy", "sampling"], default=SUMMARIZE_DEFAULTS["strategy"])
    for name in DECODING_FIELDS[1:]:
        default = SUMMARIZE_DEFAULTS[name]
        # A bool flag takes true/false as text: bool("false") is True.
        kind = _true_or_false if isinstance(default, bool) else type(default)
        note = {bool: "true or false, ", str: ""}.get(type(default), "-1: a new one each time, " if name == "seed" else "")
        dec.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                         help=f"{note}default {str(default).lower() if isinstance(default, bool) else default}")
    dec.add_argument("--max-source-length", type=int, default=0, metavar="N",
                     help="source tokens read (default 0: the length the checkpoint was trained on)")
    return p.parse_args(argv)


def _true_or_false(text: str) -> bool:
    """A boolean flag's value, spelled as the app's API accepts it; argparse names the flag."""
    try:
        return parse_flag(text, "")
    except BadInput:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def decoding_from(a: argparse.Namespace) -> dict:
    """summarize()'s keyword arguments: the decoding settings, and the source length when given."""
    decoding = decoding_kwargs(*(getattr(a, name) for name in DECODING_FIELDS))
    if a.max_source_length < 0:
        raise BadInput(f"--max-source-length cannot be negative, got {a.max_source_length}.")
    if a.max_source_length:
        decoding["max_source_length"] = a.max_source_length
    return decoding


def summarize_one(served: Served, text: str, decoding: dict, out=None, err=None) -> str:
    """Print the summary (stdout) and its statistics (stderr); return the summary."""
    out, err = out or sys.stdout, err or sys.stderr
    asked = decoding.get("max_source_length")  # summarize() caps it at the position table
    reads = min(asked, served.model.config.max_positions) if asked else served.model.source_limit
    text, read = readable_text(text, reads)  # past `read` the model reads nothing
    r = summarize(served.model, served.tokenizer, read, **decoding)
    print(r.text or "(empty summary)", file=out, flush=True)
    cut = f"text cut to its first {len(read):,} of {len(text):,} characters: " if len(read) < len(text) else ""
    truncated = f", truncated to {reads}" if r.truncated else ""
    print(
        f"[{cut}{r.num_input_tokens} input tokens{truncated}; {r.num_tokens} summary tokens in {r.seconds:.2f} s, "
        f"{r.tokens_per_sec:.1f} tokens/s]",
        file=err, flush=True,
    )
    return r.text


def run_eval(served: Served, n: int, decoding: dict, out=None) -> None:
    """ROUGE of the model and Lead-3 on the first `n` bundled articles, as a table."""
    out = out or sys.stdout
    from tqdm import tqdm

    from train.data import load_summarization_pairs
    from train.evaluate import evaluate_rouge

    if not 1 <= n <= SAMPLE_SIZE:
        raise BadInput(f"N must be between 1 and {SAMPLE_SIZE}, not {n}.")
    data = load_summarization_pairs(SAMPLE_SET, "article", "highlights", limit=n)
    with tqdm(total=len(data), desc="summarizing", unit="article", file=sys.stderr) as bar:
        report = evaluate_rouge(
            served.model, served.tokenizer, data.articles, data.summaries,
            progress=lambda done, total: bar.update(done - bar.n), **decoding,
        )
    print(report.table(), file=out, flush=True)


def paste_waiting(stream=None, wait: float = PASTE_WAIT) -> bool:
    """True when more input is already waiting on a terminal, as it is inside a paste."""
    stream = stream or sys.stdin
    try:
        return stream.isatty() and bool(select.select([stream], [], [], wait)[0])
    except (OSError, ValueError, AttributeError):  # no select on this stream (Windows, a test's StringIO)
        return False


def read_entry(
    read: Callable[[str], str] = input, more: Callable[[], bool] = paste_waiting, pending: list[str] | None = None
) -> str | None:
    """One entry at the prompt: a `>command` line, or an article's lines up to an empty line
    (one that `more()` says is followed by more pasted lines does not end it) or up to a
    `>command` line, which is kept in `pending` for the next call. None at the end of the input."""
    pending = [] if pending is None else pending
    if pending:
        return pending.pop(0)
    try:
        first = read(PROMPT)
    except EOFError:
        return None
    if not first.strip() or first.lstrip().startswith(">"):
        return first
    lines = [first]
    while True:
        try:
            line = read(MORE)
        except EOFError:
            break
        if not line.strip() and not more():
            break
        if line.lstrip().startswith(">"):  # a command right after the article: its own entry
            pending.append(line)
            break
        lines.append(line)
    return "\n".join(lines)


def handle(line: str, served: Served, decoding: dict, out=None, err=None) -> bool:
    """One prompt entry (a command, or an article of one or more lines); False when the user
    asked to quit. Bad input prints one sentence."""
    out, err = out or sys.stdout, err or sys.stderr
    line = line.strip()
    if not line:
        return True
    try:
        if line in (">exit", ">quit", ">q"):
            return False
        if line in (">help", ">?"):
            print(HELP, file=out)
        elif line.startswith(">file"):
            path = line[len(">file"):].strip()
            if not path:
                raise BadInput("Give a path: >file PATH")
            summarize_one(served, read_text_file(path, uploaded=False), decoding, out, err)
        elif line.startswith(">eval"):
            arg = line[len(">eval"):].strip()
            if arg and not arg.isdigit():
                raise BadInput(f"Give N as a whole number: >eval 20 (not {arg!r}).")
            run_eval(served, int(arg) if arg else 20, decoding, out)
        elif line.startswith(">"):
            raise BadInput(f"Unknown command {line.split()[0]!r}. {HELP}")
        else:
            summarize_one(served, line, decoding, out, err)
    except (ValueError, FileNotFoundError) as e:  # BadInput, InputError, DecodingError, DataError
        print(f"error: {e}", file=err, flush=True)
    return True


def no_checkpoint_message(watch: str, fallback: str | None) -> str:
    """What to do when there is no model: the command that trains one where this looks."""
    tried = f"{watch} or in {fallback}" if fallback else watch
    return (
        f"There is no checkpoint under {tried}; train a small one "
        f"in a few minutes with `{train_hint(watch)}` and run this again, or pass --checkpoint DIR."
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    a = parse_args(argv)
    try:
        decoding = decoding_from(a)
        store = CheckpointStore(a.watch, pinned=a.checkpoint, fallback=a.fallback or None, settle_seconds=0.0)
        store.refresh()
        served = store.require()
        if a.text is not None:
            if not a.text.strip():
                raise BadInput("--text is empty: give it the article to summarize, or use --file PATH.")
            summarize_one(served, a.text, decoding)
            return 0
        if a.file is not None:
            summarize_one(served, read_text_file(a.file, uploaded=False), decoding)
            return 0
    except NoCheckpoint:
        print(f"error: {store.warning or no_checkpoint_message(a.watch, a.fallback)}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    measured = served.measured()
    print(f"Model: {served.headline()} ({served.path})" + (f"\n{measured}" if measured else "") + f"\n{HELP}", file=sys.stderr)
    pending: list[str] = []
    while True:
        try:
            entry = read_entry(pending=pending)
        except KeyboardInterrupt:
            entry = None
        if entry is None:
            print(file=sys.stderr)
            return 0
        if not handle(entry, served, decoding):
            return 0


if __name__ == "__main__":
    sys.exit(main())
