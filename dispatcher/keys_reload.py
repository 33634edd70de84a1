"""The signing keys file, read again without a restart (docs/operations.md, "Rotating signing keys").

A dispatcher started with `--keys-file` reloads it on SIGHUP and when the file's modification
time (or size, or inode: an editor's rename-into-place) changes, checked every `CHECK_EVERY_S`
from the consume loop. A file that cannot be read or parsed keeps the keys in use and is
logged and counted (`parley_keys_reloads_total{outcome="failed"}`): a half-written file never
locks every producer out. The dispatcher's entry decoder calls `poll` between entries
(dispatcher/entries.py `reload_keys_if_due`) and uses the keyring it returns.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.runtime.stamps import Stamp, stamp_of
from parley.schemas.signing import Keyring, KeysFileError

log = logging.getLogger("parley.dispatcher")

@dataclass
class KeysReloader:
    path: str
    #: how often the loop looks at the file's stamp (a stat: cheap)
    check_every_s: float = 2.0
    #: set by the SIGHUP handler; the loop reloads on its next look, whatever the stamp says
    requested: threading.Event = field(default_factory=threading.Event)
    _stamp: Stamp = None
    _checked_at: float = float("-inf")

    def __post_init__(self) -> None:
        self._stamp = stamp_of(self.path)  # the file as the dispatcher loaded it at start
        self._checked_at = time.monotonic()

    def request(self) -> None:
        """Reload at the next look (the SIGHUP handler: safe in a signal handler)."""
        self.requested.set()

    def poll(self, keyring: Keyring) -> Keyring | None:
        """`keyring` with the file's keys when asked (SIGHUP) or when the file changed; None when
        nothing is due or the file cannot be used (then the keys in use stay)."""
        now = time.monotonic()
        if not self.requested.is_set() and now - self._checked_at < self.check_every_s:
            return None
        self._checked_at = now
        stamp = stamp_of(self.path)
        if not self.requested.is_set() and stamp == self._stamp:
            return None
        why = "signal" if self.requested.is_set() else "changed"
        self.requested.clear()
        self._stamp = stamp  # a broken file is reported once, not on every look
        try:
            reloaded = keyring.reloaded(self.path)
        except (OSError, KeysFileError) as exc:
            metrics.KEYS_RELOADS.labels(outcome="failed").inc()
            log.error("signing keys not reloaded: the keys in use stay",
                      extra=kv(path=self.path, why=why, error=str(exc)))
            return None
        metrics.KEYS_RELOADS.labels(outcome="ok").inc()
        log.info("signing keys reloaded", extra=kv(path=self.path, why=why,
                                                   principals=len(reloaded.keys)))
        return reloaded
