"""What the app's code raised, described for the person who wrote it (`AppException`).

A failing decide, tool or model call used to leave one line at INFO (`job done ... ok=False`)
and the error code in the transcript. The worker now logs it at ERROR with its traceback, and
the outcome carries the exception's type, message and the last frames of the app's own code,
which the engine puts in the event (and `parley show` prints). Parley's own frames (the job
runner that called the app) are left out: they are the same for every failure.
"""

import asyncio
import os
import traceback
from pathlib import Path

import parley
from parley.schemas.results import AppException

#: at most this many of the app's frames, innermost last; a message cut to this many characters
MAX_FRAMES = 5
MAX_MESSAGE = 500

_ROOT = str(Path(parley.__file__).resolve().parent.parent)
#: asyncio's own frames, which an `async def` of the app's is run through
_ASYNCIO = os.path.dirname(os.path.realpath(asyncio.__file__)) + os.sep


def _ours(filename: str) -> bool:
    """A frame of Parley's job runner (the package, wherever its folders are linked from), or of
    the event loop that ran an `async def` of the app's."""
    real = os.path.realpath(filename)
    return real.startswith(_ASYNCIO) or any(real.startswith(os.path.join(_ROOT, folder) + os.sep)
                                            for folder in ("parley", "workers", "schemas", "dispatcher"))


def _shown(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def describe(exc: BaseException) -> AppException:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE - 3] + "..."
    return AppException(type=type(exc).__qualname__, message=message,
                        frames=[f"{_shown(f.filename)}:{f.lineno} in {f.name}" for f in frames[-MAX_FRAMES:]])


def one_line(failure: AppException) -> str:
    """`Type: message (at path:line in function)`: the innermost frame of the app's code."""
    where = f" (at {failure.frames[-1]})" if failure.frames else ""
    return f"{failure.type}: {failure.message}{where}"
