"""The Redis Function library `parley` (dispatcher/lua/functions.lua): producers submit inputs
through its `parley_submit` (docs/protocol.md, "Writing inputs"); dispatchers keep it loaded.

Functions live in Redis, not in a process: AOF and RDB keep them across a restart, but a Redis
started empty, restored without them or `FUNCTION FLUSH`ed has none, and meanwhile every
submit fails (the client says so: `SubmitUnavailable`). So a dispatcher loads the library at
start and checks it again every few seconds, and loads it when it is missing or older than its
own. Two dispatchers of different versions never downgrade it for long: the newer one's next
check loads its own again.
"""

import logging
import re
import time
from typing import Any

from redis import Redis

from parley.dispatcher.scripts import LUA
from parley.runtime.logs import kv

log = logging.getLogger("parley.dispatcher")

LIBRARY = "parley"
_VERSION_RE = re.compile(r"^local VERSION = (\d+)$", re.MULTILINE)


def library_code() -> str:
    return LUA.source("functions")


def version_of(code: str) -> int:
    """The library version a code declares (its `local VERSION = N` line)."""
    match = _VERSION_RE.search(code)
    if match is None:
        raise ValueError("the function library declares no `local VERSION = N`")
    return int(match.group(1))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def loaded_code(reply: Any) -> str | None:
    """The code of library `parley` in a `FUNCTION LIST LIBRARYNAME parley WITHCODE` reply
    (RESP2: flat name/value lists; RESP3: maps), or None when it is not loaded."""
    for library in reply or []:
        fields = (library if isinstance(library, dict)
                  else dict(zip(library[::2], library[1::2], strict=True)))
        named = {_text(k): v for k, v in fields.items()}
        if _text(named.get("library_name", "")) == LIBRARY:
            return _text(named["library_code"])
    return None


class Functions:
    """Keeps library `parley` loaded at this dispatcher's version or newer."""

    #: how often a running dispatcher checks that the library is still there
    CHECK_S = 5.0

    def __init__(self, redis: Redis, check_s: float = CHECK_S):
        self.redis = redis
        self.code = library_code()
        self.version = version_of(self.code)
        self.check_s = check_s
        self.checked = float("-inf")

    def loaded_version(self) -> int | None:
        """The version of the library Redis holds, or None when it holds none."""
        reply = self.redis.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY, "WITHCODE")
        code = loaded_code(reply)
        if code is None:
            return None
        try:
            return version_of(code)
        except ValueError:  # not ours, or broken: replace it
            return 0

    def ensure(self) -> bool:
        """Load the library unless Redis holds this version or a newer one; True if loaded."""
        self.checked = time.monotonic()
        loaded = self.loaded_version()
        if loaded is not None and loaded >= self.version:
            return False
        self.redis.execute_command("FUNCTION", "LOAD", "REPLACE", self.code)
        log.info("loaded the submit function library",
                 extra=kv(library=LIBRARY, version=self.version, replaced=loaded))
        return True

    def recheck(self) -> None:
        """Check at the next `maintain`, not `check_s` later (after an outage)."""
        self.checked = float("-inf")

    def maintain(self) -> None:
        """`ensure`, when the last check is older than `check_s` (called every tick)."""
        if time.monotonic() - self.checked >= self.check_s:
            self.ensure()
