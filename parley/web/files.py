"""A file the inbox reads at start and again whenever it changes on disk (the users file, the
keys file): a bad edit is logged and the last good contents stay in use."""

import logging
import os
from collections.abc import Callable
from typing import Generic, TypeVar

from parley.logs import kv

log = logging.getLogger("parley.inbox")

T = TypeVar("T")


class Reloading(Generic[T]):
    def __init__(self, path: str | None, load: Callable[[str], T], what: str, value: T | None = None):
        self.path, self.load, self.what = path, load, what
        self._stamp: tuple[int, int] | None = None
        if value is not None:
            self._value = value
        else:
            assert path is not None
            self._stamp = self._stat()
            self._value = load(path)  # at start a file that cannot be read is an error

    @classmethod
    def fixed(cls, value: T) -> "Reloading[T]":
        return cls(None, lambda _p: value, "fixed", value)

    def _stat(self) -> tuple[int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def current(self) -> T:
        """The contents, read again first when the file's mtime or size changed."""
        if self.path is None:
            return self._value
        stamp = self._stat()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._value = self.load(self.path)
                log.info(f"{self.what} reloaded", extra=kv(path=self.path))
            except (OSError, ValueError) as exc:
                log.error(f"{self.what} not reloaded: the last good one stays in use",
                          extra=kv(path=self.path, error=str(exc)))
        return self._value
