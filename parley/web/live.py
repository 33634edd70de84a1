"""Live updates of the inbox: the feed of every shard, tailed once per process and fanned out
to each open page as server-sent events.

`FeedHub.run` reads `parley:feed` (docs/protocol.md, "Feed") on every shard from where it was
at start (XREAD BLOCK, no consumer group: each page process reads it all, acknowledges
nothing), and turns `interrupt.raised` into a `Change` of kind `raised` and
`interrupt.resumed` (answered here or elsewhere, or its deadline passed) and
`interrupt.cancelled` into `gone`. Every subscriber (an open page's event stream) gets every
change in a bounded queue; a subscriber too slow to keep up gets `reset` (the page reloads).
"""

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from redis.asyncio import Redis

from parley.schemas.keys import Keys


class ChangeKind(StrEnum):
    RAISED = "raised"
    GONE = "gone"
    #: the subscriber missed changes: reload the page
    RESET = "reset"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    session: str = ""
    interrupt_id: str = ""
    #: the feed's event, whole (empty for RESET)
    event: dict[str, Any] | None = None


class FeedHub:
    def __init__(self, clients: Sequence[Redis], keys: Keys, queue_size: int = 1000):
        raise NotImplementedError

    async def run(self) -> None:
        """Tail every shard's feed until cancelled, through Redis outages (backoff)."""
        raise NotImplementedError

    def subscribe(self) -> "Subscription":
        raise NotImplementedError


class Subscription:
    """An async iterator of changes; `close()` (or leaving `async with`) unsubscribes."""

    def __aiter__(self) -> AsyncIterator[Change]:
        raise NotImplementedError


async def event_stream(subscription: Subscription, render: Callable[[Change], Awaitable[str | None]],
                       is_disconnected: Callable[[], Awaitable[bool]],
                       ping_s: float = 15.0) -> AsyncIterator[str]:
    """The text/event-stream body for one page: `event: raised` with the row's HTML (`render`
    returns None for a row the page's filters do not show: nothing is sent), `event: gone` with
    `{session, interrupt_id, timed_out}`, `event: reset`; a comment every `ping_s`."""
    raise NotImplementedError
    yield ""
