"""The move lock: one `parley partitions move`, `rebalance`, `add-shards` or `repair` at a time.

Each writes the placement table at version v+1 from the v it read; two at once would each
write their own v+1 and, shard by shard, the last write would win (a freeze lost, inputs of
a partition accepted on two shards). So each takes `<prefix>:partitions:lock` on a majority of
the shards first (SET NX with an expiry and a token naming its holder), renews it from a thread
while it runs, and deletes it at the end only where it still holds it. A mover killed with -9
leaves its lock until the expiry; the refusal says who holds it and how to clear it by hand.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
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


_DOWN = (redis.ConnectionError, redis.TimeoutError)


class MoveLock:
    """Held with `with MoveLock(shards, key):`; `lost` once a renewal found it gone or taken.

    The lock is the key `key` on every shard, held once a majority of them took it (SET NX, one
    token): any two majorities share a shard, so two movers never both hold it, and a shard
    that does not answer (down, for good or a while) does not stop a move between the others.
    A renewal that keeps it on fewer than a majority marks it `lost`."""

    def __init__(self, shards: redis.Redis | Sequence[redis.Redis], key: str, lock_ms: int = LOCK_MS,
                 renew_every_s: float = RENEW_EVERY_S):
        self.clients = [shards] if isinstance(shards, redis.Redis) else list(shards)
        self.key = key
        self.lock_ms = lock_ms
        self.renew_every_s = renew_every_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lost = False
        #: when a majority last held it for us (time.monotonic())
        self.renewed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def needed(self) -> int:
        return len(self.clients) // 2 + 1

    def __enter__(self) -> MoveLock:
        taken, holders = [], set()
        for i, r in enumerate(self.clients):
            try:
                if r.set(self.key, self.token, nx=True, px=self.lock_ms):
                    taken.append(i)
                else:
                    holder: Any = r.get(self.key)
                    if holder is not None:
                        holders.add(holder.decode() if isinstance(holder, bytes) else str(holder))
            except _DOWN:
                continue
        if len(taken) < self.needed:
            self._release(taken)
            where = "shard 0" if len(self.clients) == 1 else "the shards"
            if not holders:
                raise LockHeld(f"the move lock ({self.key}) needs a majority of the shards, "
                               f"{self.needed} of {len(self.clients)}, and only {len(taken)} answered")
            raise LockHeld(
                f"another `parley partitions move` or `repair` is running ({', '.join(sorted(holders))} "
                f"holds {self.key} on {where}): wait for it to end; if its process is gone, the lock "
                f"expires within {self.lock_ms // 1000} s, or delete {self.key} on {where} by hand")
        self.renewed_at = time.monotonic()
        self._thread = threading.Thread(target=self._renew, name="move-lock", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            kept = answered = 0
            for r in self.clients:
                try:
                    kept += int(bool(r.eval(_RENEW, 1, self.key, self.token, self.lock_ms)))
                    answered += 1
                except _DOWN:
                    continue  # a shard unreachable a moment: the expiry leaves room for retries
            if kept >= self.needed:
                self.renewed_at = time.monotonic()
            elif answered >= self.needed or time.monotonic() - self.renewed_at > self.lock_ms * 0.8 / 1000:
                # taken by another where it expired; or too few shards answered for so long that
                # it may have expired on a majority, which another may hold now
                self.lost = True
                return

    def _release(self, shards: Sequence[int]) -> None:
        for i in shards:
            with contextlib.suppress(redis.RedisError):  # unreachable: it expires by itself
                self.clients[i].eval(_RELEASE, 1, self.key, self.token)

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._release(range(len(self.clients)))
