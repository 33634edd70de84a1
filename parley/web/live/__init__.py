"""Live updates of the inbox: the feed of every shard, tailed once per process and fanned out
to each open page as server-sent events.

`FeedHub.run` reads `parley:feed` (docs/protocol.md, "Feed") on every shard from where it was
at start (XREAD BLOCK, no consumer group: each page process reads it all, acknowledges
nothing), and turns `interrupt.raised` into a `Change` of kind `raised` and
`interrupt.resumed` (answered here or elsewhere, or its deadline passed) and
`interrupt.cancelled` into `gone`. Every subscriber (an open page's event stream) gets every
change in a bounded queue; a subscriber too slow to keep up gets `reset` (the page reloads).

Nothing is lost between a page's render and its stream, nor across a reconnect: the hub keeps
the last `replay_size` changes with their feed entry's time, and knows from when it holds every
change (`covered_from_ms`: just after the feed's last entry when it started, later when the feed
lost entries or the buffer dropped its oldest). A page subscribes with `since` (the server's ms
when it rendered; a browser that reconnects reuses its URL, so the same `since`): it gets the
buffered changes from `since - CLOCK_MARGIN_MS` on, then the live ones; when the buffer does not
reach back that far, a RESET first (the page reloads and renders anew). Replayed duplicates are
harmless: a row already shown is skipped, a gone row not shown is a no-op.

A raised row is looked up once per process (`RowCache`, in-flight lookups shared by every page)
for at most `ROW_DELAYS_S` (the index follows the feed entry by the outbox flush), and a page's
stream starts the lookups of all its queued changes at once, so one row not found holds later
changes up by that bound at most, and each interrupt's changes still go out in order.

A shard that goes away is waited out with backoff, and read again from the last entry read, so
a page misses nothing of a short outage. When the feed itself lost entries the hub had not read
yet (trimmed past it while it was away, or the shard came back without its data), every
subscriber gets `reset` instead: the pages reload and show what is open now.

The pure parts: changes.py (the feed entries followed, and which page wants which), replies.py
(what the feed's Redis replies say), sse.py (the events' text). The shell: hub.py (`FeedHub`:
the reader task per shard, the subscribers, the replay buffer), subscription.py (one page's
queue), rows.py (`RowCache`), stream.py (`event_stream`, one page's text/event-stream body).
"""

from parley.web.live.changes import (
    GONE_TYPES,
    RAISED_TYPE,
    RESET,
    Change,
    ChangeKind,
    change_of,
    shown_by,
    since_of,
)
from parley.web.live.hub import CLOCK_MARGIN_MS, STOP_GRACE_S, FeedHub, block_within
from parley.web.live.replies import STREAM_START, entries_of, stream_id, why_lost
from parley.web.live.rows import ROW_DELAYS_S, ROW_KEEP_S, RowCache
from parley.web.live.sse import HELLO, PING, RECONNECT_MS, frame, frame_of
from parley.web.live.stream import RENDER_AHEAD, event_stream
from parley.web.live.subscription import Subscription

__all__ = [
    "CLOCK_MARGIN_MS",
    "GONE_TYPES",
    "HELLO",
    "PING",
    "RAISED_TYPE",
    "RECONNECT_MS",
    "RENDER_AHEAD",
    "RESET",
    "ROW_DELAYS_S",
    "ROW_KEEP_S",
    "STOP_GRACE_S",
    "STREAM_START",
    "Change",
    "ChangeKind",
    "FeedHub",
    "RowCache",
    "Subscription",
    "block_within",
    "change_of",
    "entries_of",
    "event_stream",
    "frame",
    "frame_of",
    "shown_by",
    "since_of",
    "stream_id",
    "why_lost",
]
