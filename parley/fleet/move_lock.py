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
    """Held with `with MoveLock(shards, key):`; `lost` once it may no longer be ours.

    The lock is the key `key` on every shard, held once a majority of them took it (SET NX, one
    token): any two majorities share a shard, so two movers never both hold it, and a shard
    that does not answer (down, for good or a while) does not stop a move between the others.
    `groups` (lists of shard indexes) asks a majority of each instead: `add-shards` needs one of
    the old shards and one of every URL given (a mover given either list is then excluded).

    It is `lost` once a renewal found it taken where a majority answered, or once no renewal
    has kept it on a majority for 80 % of its life (it may have expired there, and another may
    hold it): a mover checks `lost` before every table it writes."""

    def __init__(self, shards: redis.Redis | Sequence[redis.Redis], key: str, lock_ms: int = LOCK_MS,
                 renew_every_s: float = RENEW_EVERY_S, groups: Sequence[Sequence[int]] | None = None):
        self.clients = [shards] if isinstance(shards, redis.Redis) else list(shards)
        self.key = key
        self.lock_ms = lock_ms
        self.renew_every_s = min(renew_every_s, lock_ms / 1000 / 5)
        self.groups = [list(g) for g in groups] if groups else [list(range(len(self.clients)))]
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._lost = False
        #: when a renewal round that kept it on a majority began (time.monotonic())
        self.renewed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lost(self) -> bool:
        return self._lost or (self.renewed_at > 0
                              and time.monotonic() - self.renewed_at > self.lock_ms * 0.8 / 1000)

    def held_by(self, shards: set[int]) -> bool:
        """A majority of every group is among `shards`."""
        return all(len(shards & set(g)) >= len(g) // 2 + 1 for g in self.groups)

    def __enter__(self) -> MoveLock:
        began = time.monotonic()
        taken, holders, answered = [], set(), 0
        for i, r in enumerate(self.clients):
            try:
                if r.set(self.key, self.token, nx=True, px=self.lock_ms):
                    taken.append(i)
                else:
                    holder: Any = r.get(self.key)
                    if holder is not None:
                        holders.add(holder.decode() if isinstance(holder, bytes) else str(holder))
                answered += 1
            except _DOWN:
                continue
        if not self.held_by(set(taken)):
            self._release(taken)
            where = "shard 0" if len(self.clients) == 1 else "the shards"
            if not holders:
                raise LockHeld(f"the move lock ({self.key}) needs a majority of the shards, "
                               f"{len(self.clients) // 2 + 1} of {len(self.clients)}, and only {answered} "
                               "answered")
            raise LockHeld(
                f"another `parley partitions move` or `repair` is running ({', '.join(sorted(holders))} "
                f"holds {self.key} on {where}): wait for it to end; if its process is gone, the lock "
                f"expires within {self.lock_ms // 1000} s, or delete {self.key} on {where} by hand")
        self.renewed_at = began
        self._thread = threading.Thread(target=self._renew, name="move-lock", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            began = time.monotonic()
            kept: set[int] = set()
            answered: set[int] = set()
            for i, r in enumerate(self.clients):
                try:
                    if r.eval(_RENEW, 1, self.key, self.token, self.lock_ms):
                        kept.add(i)
                    answered.add(i)
                except _DOWN:
                    continue  # a shard unreachable a moment: `lost` says when it is too long
            if self.held_by(kept):
                self.renewed_at = began
            elif self.held_by(answered):  # a majority answered, and it is not ours there
                self._lost = True
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
