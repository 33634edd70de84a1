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
