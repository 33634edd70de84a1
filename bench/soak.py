"""The soak (bench/README.md, scenario 8): many sessions run to their end, closed and expired,
and what they leave in Redis afterwards — memory and keys.

Sessions are closed by the engine itself: the dispatcher runs with `--idle-timeout`, so each
finished session is closed as idle that long after its last transition, archived, and deleted
`--retention` after its close. They run in chunks (`chunk` at a time, through the seed flow of
scenario 1), so that no parked session waits for its resume anywhere near the idle timeout.
The fleet-wide streams that are capped rather than emptied (the feed, the archive) run at
their smallest cap, so that what remains is what the sessions left, not those streams' fixed
size; their memory at the end is reported too.

The starting value is taken after a warm-up (a few sessions through the same whole life):
an idle fleet that has worked once holds fixed bookkeeping a fresh Redis does not (its scripts
cached, its streams and consumer groups, RQ's registries); the fresh figure is reported too.
"""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.driver import Producer, Track, run_flow
from bench.fleet import Fleet

RETENTION_S = 1
WARM_UP_SESSIONS = 100


def key_sizes(r: Any) -> dict[str, int]:
    """MEMORY USAGE of every key (the fleet's own: a few dozen once the sessions are gone)."""
    return {k.decode(): int(r.memory_usage(k, samples=0) or 0) for k in r.scan_iter(count=5000)}


def session_keys_left(r: Any, prefix: str) -> int:
    """Keys of the sessions named `prefix...` still in Redis: a SCAN for their hash tag."""
    return sum(1 for _ in r.scan_iter(match=f"parley:{{{prefix}*", count=5000))


class Soak:
    def __init__(self, fleet: Fleet, chunk: int, idle_timeout_s: int, timeout: float,
                 log: Callable[[str], None]):
        self.fleet = fleet
        self.chunk = chunk
        self.idle_timeout_s = idle_timeout_s
        self.timeout = timeout
        self.log = log
        self.producer = Producer(fleet.redis, fleet.keys, 1, idempotency_keys=True)

    def run(self, tracks: list[Track]) -> float:
        """The seed flow of every track, a chunk at a time; the wall seconds."""
        t0 = time.monotonic()
        for start in range(0, len(tracks), self.chunk):
            # each session's own stream, not the feed: this fleet caps the feed at one entry
            run_flow(self.producer, tracks[start:start + self.chunk], self.timeout, self.fleet.check_alive,
                     follow="streams")
        self.fleet.quiesce()
        return time.monotonic() - t0

    def retire(self) -> float:
        """Until no session is waiting to be closed as idle or to expire; the wall seconds."""
        r, k = self.fleet.redis, self.fleet.keys
        t0 = time.monotonic()
        deadline = t0 + self.idle_timeout_s + RETENTION_S + self.timeout
        while r.zcard(k.idle) or r.zcard(k.expiring):
            self.fleet.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{r.zcard(k.idle)} idle and {r.zcard(k.expiring)} expiring sessions "
                                   f"left after {deadline - t0:.0f} s")
            time.sleep(0.2)
        self.fleet.quiesce()
        time.sleep(0.5)  # the last replies drain from client buffers
        return time.monotonic() - t0


def soak_row(workdir: Path, sessions: int, chunk: int, idle_timeout_s: int, timeout: float, workers: int,
             log: Callable[[str], None]) -> dict[str, Any]:
    fleet = Fleet(workdir, appendfsync="everysec", workers=workers, dispatcher_args=[
        "--idle-timeout", str(idle_timeout_s), "--retention", str(RETENTION_S),
        "--feed-maxlen", "1", "--archive-maxlen", "1"]).start()
    try:
        r, k = fleet.redis, fleet.keys
        soak = Soak(fleet, chunk, idle_timeout_s, timeout, log)
        fresh = r.info("memory")["used_memory"]
        soak.run([Track(f"warm-{i}") for i in range(min(WARM_UP_SESSIONS, sessions))])
        soak.retire()
        # Every command the measurement itself sends, once before the starting value: Redis
        # allocates a latency histogram per command name on its first call (latency-tracking),
        # which would otherwise count as memory the sessions left.
        key_sizes(r)
        session_keys_left(r, "soak-")
        r.dbsize()
        called0 = set(r.info("commandstats"))
        mem0 = r.info("memory")
        keys0 = int(r.dbsize())
        sizes0 = key_sizes(r)
        tracks = [Track(f"soak-{i}") for i in range(sessions)]
        run_wall = soak.run(tracks)
        problems = sum(1 for t in tracks if t.problem)
        mem_run = r.info("memory")
        keys_run = session_keys_left(r, "soak-")
        log(f"  {sessions} sessions run in {run_wall:.1f} s ({problems} problems); waiting for "
            f"their idle close ({idle_timeout_s} s) and expiry ({RETENTION_S} s)")
        retire_wall = soak.retire()
        mem1 = r.info("memory")
        called1 = set(r.info("commandstats"))
        sizes1 = key_sizes(r)
        before, after = mem0["used_memory"], mem1["used_memory"]
        return {
            "sessions": sessions, "chunk": chunk, "idle_timeout_s": idle_timeout_s,
            "retention_s": RETENTION_S, "problems": problems, "run_wall_s": round(run_wall, 1),
            "close_and_expire_wall_s": round(retire_wall, 1),
            "used_memory_fresh": fresh, "used_memory_before": before,
            "used_memory_run": mem_run["used_memory"], "used_memory_after": after,
            "used_memory_growth_pct": round(100 * (after - before) / before, 2),
            "used_memory_dataset_before": mem0["used_memory_dataset"],
            "used_memory_dataset_after": mem1["used_memory_dataset"],
            "session_keys_after_run": keys_run, "session_keys_left": session_keys_left(r, "soak-"),
            "keys_before": keys0, "keys_after": int(r.dbsize()),
            "info_memory_delta": {name: mem1[name] - mem0[name] for name in sorted(mem1)
                                  if isinstance(mem1[name], int) and isinstance(mem0.get(name), int)
                                  and mem1[name] != mem0[name]},
            # where the difference is: in the keys (all of them: MEMORY USAGE), or outside them
            "keys_bytes_delta": sum(sizes1.values()) - sum(sizes0.values()),
            # the keys that grew (or appeared) by more than 1 KiB
            "keys_grown_bytes": {key: size - sizes0.get(key, 0) for key, size in sorted(sizes1.items())
                                 if size - sizes0.get(key, 0) > 1024},
            # commands Redis ran for the first time during the measured run (the engine's rarer
            # paths): each first call allocates that command's latency histogram, outside any key
            "commands_first_called": sorted(c.removeprefix("cmdstat_") for c in called1 - called0),
            "capped_streams_bytes_after": {"feed": int(r.memory_usage(k.feed, samples=0) or 0),
                                           "archive": int(r.memory_usage(k.archive, samples=0) or 0)},
        }
    finally:
        fleet.stop()
