"""Running the app's `async def` functions (tools, `decide`, `llm`) on the worker's event loop.

A worker runs one job at a time in its main thread, so one event loop per process, kept for
the worker's life, serves every coroutine: whatever the app opened on it (an HTTP client's
connection pool, say) stays usable from one job to the next, as it would in an asyncio app.
A job's time limit (RQ's, a signal in the main thread) or any other exception while it waits
cancels the coroutine's task, so nothing of a job outlives it on the loop.
"""

import asyncio
import contextlib
import inspect
from typing import Any

_loop: asyncio.AbstractEventLoop | None = None


def resolved(value: Any) -> Any:
    """`value` itself, or what it resolves to when the app's function returned an awaitable."""
    if not inspect.isawaitable(value):
        return value
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    task = _loop.create_task(_awaited(value))
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # interrupted while it waits (a time limit): cancelled, and let end
            task.cancel()
            with contextlib.suppress(BaseException):  # its own cancellation, or the error raised
                _loop.run_until_complete(task)
        raise


async def _awaited(value: Any) -> Any:
    return await value
