"""Slowing down password guessing (pure): after `free` failed sign-ins for one principal or
from one address within `window_s`, further attempts for it are refused (429) for a time that
doubles with each further failure, up to `cap_s`, without checking the password. A success
clears the principal's count. Kept per process, in a bounded table: a replica counts its own
attempts."""

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class Failures:
    count: int
    first_at: float
    last_at: float


class Throttle:
    def __init__(self, free: int = 5, window_s: float = 900, base_s: float = 2, cap_s: float = 300,
                 max_tracked: int = 10_000):
        self.free, self.window_s, self.base_s, self.cap_s = free, window_s, base_s, cap_s
        self.max_tracked = max_tracked
        self._failures: OrderedDict[str, Failures] = OrderedDict()

    def wait_s(self, keys: list[str], now: float) -> float:
        """How long until an attempt for these keys (a principal, an address) is allowed: 0 now."""
        return max((self._wait_of(k, now) for k in keys), default=0.0)

    def _wait_of(self, key: str, now: float) -> float:
        failures = self._failures.get(key)
        if failures is None or now - failures.first_at > self.window_s or failures.count < self.free:
            return 0.0
        lock = min(self.cap_s, self.base_s * 2 ** (failures.count - self.free))
        return max(0.0, failures.last_at + lock - now)

    def failed(self, keys: list[str], now: float) -> None:
        for key in keys:
            failures = self._failures.get(key)
            if failures is None or now - failures.first_at > self.window_s:
                failures = Failures(0, now, now)
            failures.count += 1
            failures.last_at = now
            self._failures[key] = failures
            self._failures.move_to_end(key)
        while len(self._failures) > self.max_tracked:
            self._failures.popitem(last=False)

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
