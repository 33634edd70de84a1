"""The move lock: one `parley partitions move` or `repair` at a time in a deployment.

Each writes the placement table at version v+1 from the v it read; two at once would each
write their own v+1 and, shard by shard, the last write would win (a freeze lost, inputs of
a partition accepted on two shards). So each takes `<prefix>:partitions:lock` on shard 0 first
(SET NX with an expiry and a token naming its holder), renews it from a thread while it runs,
and deletes it at the end only if it still holds it. A mover killed with -9 leaves its lock
until the expiry; the refusal says who holds it and how to clear it by hand.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
from typing import Any

import redis

#: a stale lock (its mover died) blocks other moves this long at most
LOCK_MS = 120_000
#: renewed this often while the move runs, well within LOCK_MS
RENEW_EVERY_S = 20.0

# compare-and-delete / compare-and-expire: only the holder's token acts
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
_RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
          "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0")


class LockHeld(Exception):
    """Another move or repair holds the lock: the message names it and how to clear it."""


class MoveLock:
    """Held with `with MoveLock(shard0, key):`; `lost` once a renewal found it gone or taken."""

    def __init__(self, r: redis.Redis, key: str, lock_ms: int = LOCK_MS,
                 renew_every_s: float = RENEW_EVERY_S):
        self.r = r
        self.key = key
        self.lock_ms = lock_ms
        self.renew_every_s = renew_every_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MoveLock:
        if not self.r.set(self.key, self.token, nx=True, px=self.lock_ms):
            holder: Any = self.r.get(self.key)
            name = holder.decode() if isinstance(holder, bytes) else holder
            raise LockHeld(
                f"another `parley partitions move` or `repair` is running ({name} holds {self.key} "
                f"on shard 0): wait for it to end; if its process is gone, the lock expires within "
                f"{self.lock_ms // 1000} s, or delete {self.key} on shard 0 by hand")
        self._thread = threading.Thread(target=self._renew, name="move-lock", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                if not self.r.eval(_RENEW, 1, self.key, self.token, self.lock_ms):
                    self.lost = True
                    return
            except redis.RedisError:
                continue  # shard 0 unreachable a moment: the expiry leaves room for retries

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(redis.RedisError):  # unreachable: it expires by itself
            self.r.eval(_RELEASE, 1, self.key, self.token)
