"""One open page's subscription to the hub's changes: a bounded queue the hub offers each change
to (never blocking), and the page's stream takes them from."""

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from parley.web.live.changes import RESET, Change, ChangeKind


class Subscription:
    """An async iterator of changes; `close()` (or leaving `async with`) unsubscribes.

    Its queue holds at most `queue_size` changes. One more clears it and leaves a single RESET
    (what was queued is stale: the page reloads); changes that come before the subscriber has
    taken that RESET are dropped too, as the reload shows them anyway."""

    def __init__(self, queue_size: int = 1000, on_close: Callable[["Subscription"], None] | None = None):
        if queue_size < 1:
            raise ValueError(f"a subscription's queue size must be at least 1, not {queue_size}")
        self.queue_size = queue_size
        self._queue: deque[Change] = deque()
        self._ready = asyncio.Event()
        self._reset_pending = False
        self._closed = False
        self._on_close = on_close
        #: how many times this subscriber fell behind
        self.resets = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, change: Change) -> None:
        """Queue `change` for this subscriber (never blocks the hub)."""
        if self._closed or self._reset_pending:
            return
        if change.kind is ChangeKind.RESET or len(self._queue) >= self.queue_size:
            self._queue.clear()
            self._queue.append(RESET)
            self._reset_pending = True
            self.resets += 1
        else:
            self._queue.append(change)
        self._ready.set()

    async def get(self, timeout: float | None = None) -> Change | None:
        """The next change; None when `timeout` seconds passed without one or once closed."""
        while not self._queue:
            if self._closed:
                return None
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        if self._closed:
            return None
        change = self._queue.popleft()
        if change.kind is ChangeKind.RESET:
            self._reset_pending = False
        return change

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._ready.set()  # wakes a `get` waiting for a change: it returns None
        if self._on_close is not None:
            self._on_close(self)

    def __aiter__(self) -> AsyncIterator[Change]:
        return self

    async def __anext__(self) -> Change:
        change = await self.get()
        if change is None:
            raise StopAsyncIteration
        return change

    async def __aenter__(self) -> "Subscription":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()
