"""What every training command does around its task: logging, settings, model, loop, exit code."""
from __future__ import annotations

import logging
from typing import Callable

from b2b import Bert2Bert, Tokenizer

from .init import build_model
from .loop import Task, TrainingInterrupted, TrainingStopped, run
from .settings import TrainSettings, parse_settings

log = logging.getLogger(__name__)


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")


def run_command(
    settings_cls: type[TrainSettings],
    make_task: Callable[[TrainSettings, Tokenizer, Bert2Bert], Task],
    argv: list[str] | None,
    description: str,
) -> int:
    """Parse the flags, build the model, train; 0 when done, 1 when training had to stop,
    2 for bad input (one logged sentence, no traceback), 128 + signal number (130 for Ctrl-C)
    when interrupted."""
    setup_logging()
    s = parse_settings(settings_cls, argv, description=description)
    try:
        model, tokenizer = build_model(s, share=getattr(s, "share", False), pointer=getattr(s, "pointer_generator", False))
        run(model, tokenizer, make_task(s, tokenizer, model), s, s.out)
    except TrainingStopped as e:
        log.error("%s", e)
        return 1
    except TrainingInterrupted as e:
        log.warning("%s", e)
        return e.exit_code
    except KeyboardInterrupt:
        log.error("Aborted by Ctrl-C without saving a checkpoint.")
        return 130
    except (ValueError, FileNotFoundError) as e:
        log.error("%s", e)
        return 2
    return 0
