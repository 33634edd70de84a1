"""Following one session's shard while its partition may move (docs/operations.md, "Clients
over several shards").

Pure (no I/O). A reader that blocks on a session's events stream, or looks a session up, uses
the placement it read last. A move copies the session's keys to the target shard (the events
stream whole, with its ids), flips the table, then deletes the source's copy: a reader still on
the source sees nothing new, ever. So a blocking read that comes back empty, or a lookup that
finds nothing, reads the table again and goes on where the session is now, from the same
stream id. `Reread` paces those reads: an idle watcher costs one HMGET per shard a second,
not one per empty read.
"""

import math
from typing import Any

#: a reader on an idle session reads the placement again at most this often
REREAD_EVERY_S = 1.0


class Reread:
    """When an empty read may read the placement again: at most every `every_s` seconds."""

    def __init__(self, every_s: float = REREAD_EVERY_S):
        self.every_s = every_s
        self.last = -math.inf

    def due(self, now: float) -> bool:
        """True (and the clock restarts) if `every_s` has passed since the last re-read."""
        if now - self.last < self.every_s:
            return False
        self.last = now
        return True


def block_of(left_ms: int, sharded: bool) -> int:
    """How long one blocking read of a wait may block: the time left, cut to the re-read
    period when a move may take the session elsewhere meanwhile."""
    return min(left_ms, int(REREAD_EVERY_S * 1000)) if sharded else left_ms


#: redis-py's default socket timeout (sync and asyncio): the connection's own, not in the
#: pool's settings
REDIS_DEFAULT_SOCKET_TIMEOUT_S = 5.0


def socket_timeout_of(client: Any) -> float | None:
    """The socket timeout of a redis-py client (sync or asyncio): what a blocking read must stay
    within, or the client cuts it off as a TimeoutError."""
    connection = getattr(client, "connection", None)  # a single-connection client's
    if connection is not None:
        timeout: float | None = connection.socket_timeout
        return timeout
    kwargs = client.connection_pool.connection_kwargs
    timeout = kwargs.get("socket_timeout", REDIS_DEFAULT_SOCKET_TIMEOUT_S)
    return timeout


def within_socket_timeout(block_ms: int, timeout_s: float | None) -> int:
    """`block_ms`, cut well within a socket timeout of `timeout_s` (None: none). Redis answers a
    timed-out block on its next cron tick (up to 100 ms late at hz 10), and a busy machine adds
    to that: half the timeout is left over, up to a second."""
    if not timeout_s:
        return block_ms
    timeout_ms = int(timeout_s * 1000)
    return max(1, min(block_ms, timeout_ms - min(1000, timeout_ms // 2)))
