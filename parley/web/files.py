"""A file the inbox reads at start and again whenever it changes on disk (the users file, the
keys file): a bad edit is logged and the last good contents stay in use."""

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from parley.runtime.logs import kv
from parley.runtime.stamps import Stamp, stamp_of

log = logging.getLogger("parley.inbox")

T = TypeVar("T")


#: how often the file is looked at (one stat): a page asks for its contents many times per
#: request (every row asks whether its person may answer), the disk at most this often
CHECK_EVERY_S = 1.0


class Reloading(Generic[T]):
    def __init__(self, path: str | None, load: Callable[[str], T], what: str, value: T | None = None,
                 check_every_s: float = CHECK_EVERY_S):
        self.path, self.load, self.what = path, load, what
        self.check_every_s = check_every_s
        self._checked_at = time.monotonic()
        self._stamp: Stamp = None
        if value is not None:
            self._value = value
        else:
            assert path is not None
            self._stamp = stamp_of(path)
            self._value = load(path)  # at start a file that cannot be read is an error

    @classmethod
    def fixed(cls, value: T) -> "Reloading[T]":
        return cls(None, lambda _p: value, "fixed", value)

    def current(self) -> T:
        """The contents, read again first when the file changed (looked at once per
        `check_every_s`)."""
        now = time.monotonic()
        if self.path is None or now - self._checked_at < self.check_every_s:
            return self._value
        self._checked_at = now
        stamp = stamp_of(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._value = self.load(self.path)
                log.info(f"{self.what} reloaded", extra=kv(path=self.path))
            except (OSError, ValueError) as exc:
                log.error(f"{self.what} not reloaded: the last good one stays in use",
                          extra=kv(path=self.path, error=str(exc)))
        return self._value
