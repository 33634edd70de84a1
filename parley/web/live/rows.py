"""Each raised interrupt's row looked up once per process, for every page that shows it (the
index follows the feed entry by the outbox flush: a lookup asks again after each of
`ROW_DELAYS_S`)."""

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

#: the waits before each look-up of a raised interrupt's row (0.35 s in all: the outbox flush
#: writes it right after the feed entry)
ROW_DELAYS_S = (0.0, 0.05, 0.1, 0.2)
#: how long a looked-up row is kept for the pages that take the same change a little later
ROW_KEEP_S = 10.0


class RowCache:
    """Each raised interrupt's row looked up once per process: the lookups in flight (and done
    within `keep_s`) by (session, interrupt_id), shared by every page that asks. A lookup asks
    after each of `delays_s` until the row is there (None: never there, or gone already)."""

    def __init__(self, delays_s: Sequence[float] = ROW_DELAYS_S, keep_s: float = ROW_KEEP_S):
        if not delays_s or any(d < 0 for d in delays_s):
            raise ValueError(f"a row lookup needs at least one delay, none negative, not {list(delays_s)}")
        if keep_s <= 0:
            raise ValueError(f"keep_s must be positive, not {keep_s}")
        self.delays_s = tuple(delays_s)
        self.keep_s = keep_s
        self._lookups: dict[tuple[str, str], tuple[float, asyncio.Task[Any]]] = {}
        #: how many lookups were started (each asks Redis up to len(delays_s) times)
        self.started = 0

    async def get(self, session: str, interrupt_id: str,
                  read: Callable[[str, str], Awaitable[Any]]) -> Any:
        """The row of (session, interrupt_id) by `read(session, interrupt_id)` (None when not
        there), sharing a lookup already made or in flight. A caller cancelled while waiting
        does not cancel the lookup of the others."""
        now = time.monotonic()
        self._forget(now)
        key = (session, interrupt_id)
        found = self._lookups.get(key)
        if found is None:
            task = asyncio.create_task(self._look_up(session, interrupt_id, read),
                                       name=f"parley-inbox-row-{interrupt_id}")
            found = (now, task)
            self._lookups[key] = found
            self.started += 1
        return await asyncio.shield(found[1])

    async def _look_up(self, session: str, interrupt_id: str,
                       read: Callable[[str, str], Awaitable[Any]]) -> Any:
        for delay in self.delays_s:
            await asyncio.sleep(delay)
            row = await read(session, interrupt_id)
            if row is not None:
                return row
        return None

    def _forget(self, now: float) -> None:
        old = [key for key, (started, task) in self._lookups.items()
               if task.done() and now - started > self.keep_s]
        for key in old:
            _, task = self._lookups.pop(key)
            if not task.cancelled():
                task.exception()  # taken: a failed lookup is not reported as never retrieved
