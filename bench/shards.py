"""Scenario 11, shards: the seed cycle on 1 shard and on S shards, then sessions parked on each.

Each shard is a unit of its own: a private redis-server, one `parley dispatcher --shard i` and
`workers` `parley worker --shard i`, every process given every shard's URL in order (one URL
and no `--shard` for the row of one shard: a deployment of one Redis, as before shards). The
first dispatcher writes the placement (partition -> shard, p mod S); this driver reads it
(`Shards.refresh`) and routes each session's inputs and event reads to its shard, as the
client does. Both rows use the same partition count; the row of S shards runs S times the
processes of the row of one (bench/README.md says what that means on 2 cores).
"""

import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis

from bench.driver import FEED_BLOCK_MS, FeedEntry, Producer, Track, run_flow
from bench.fleet import cpu_seconds, deploy_tuning, machine_busy_seconds, rss_kib
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer, free_port, start_parley, stop_process
from parley.schemas.keys import Keys

APP = "examples.seed_app"
# with several shards, the pause between rounds of non-blocking feed reads that found nothing
SHARDS_IDLE_MS = 5


class ShardsError(RuntimeError):
    pass


class RoutedProducer(Producer):
    """The bench producer over several shards: each session's inputs go to its shard's input
    stream and its events are read there (the placement decides, `Shards.index_of_session`);
    sessions are followed through every shard's own feed."""

    def __init__(self, shards: Shards, partitions: int, idempotency_keys: bool = True):
        super().__init__(shards.clients[0], shards.keys, partitions, idempotency_keys)
        self.shards = shards
        self.each = [Producer(r, shards.keys, partitions, idempotency_keys) for r in shards.clients]

    def shard_of(self, session: str) -> int:
        return self.shards.index_of_session(session)

    def send(self, items: Iterable[tuple[str, dict[str, Any], str]]) -> list[int]:
        items = list(items)
        by_shard: dict[int, list[int]] = {}
        for n, (session, _value, _idem) in enumerate(items):
            by_shard.setdefault(self.shard_of(session), []).append(n)
        out = [0] * len(items)
        for shard, positions in by_shard.items():
            ms = self.each[shard].send(items[n] for n in positions)
            for n, m in zip(positions, ms, strict=True):
                out[n] = m
        return out

    def by_shard(self, tracks: list[Track]) -> dict[int, list[Track]]:
        out: dict[int, list[Track]] = {}
        for t in tracks:
            out.setdefault(self.shard_of(t.session), []).append(t)
        return out

    def read_counts(self) -> Counter[str]:
        return sum((p.read_counts() for p in self.each), Counter())

    def follow_feed(self) -> None:
        for p in self.each:
            p.follow_feed()

    def feed(self, block_ms: int | None = FEED_BLOCK_MS) -> list[FeedEntry]:
        """Every shard's feed (each shard's Redis has its own): one non-blocking XREAD each, and
        a pause of a few ms when none had anything (one blocking read would hold up the others)."""
        out = [entry for p in self.each for entry in p.feed(None)]
        if not out and block_ms:
            time.sleep(min(block_ms, SHARDS_IDLE_MS) / 1000)
        return out

    def read_rest(self, tracks: list[Track]) -> list[tuple[Track, dict[str, Any]]]:
        return [pair for shard, ts in self.by_shard(tracks).items()
                for pair in self.each[shard].read_rest(ts)]

    def poll(self, tracks: list[Track], block_ms: int | None = None) -> list[tuple[Track, dict[str, Any]]]:
        return [pair for shard, ts in self.by_shard(tracks).items() for pair in self.each[shard].poll(ts)]


class ShardFleet:
    """S redis-servers and, per shard, a dispatcher and `workers` workers as real processes."""

    def __init__(self, workdir: Path, shards: int, workers: int, partitions: int,
                 appendfsync: str = "always"):
        self.workdir = workdir
        self.count = shards
        self.workers = workers
        self.partitions = partitions
        self.appendfsync = appendfsync
        self.keys = Keys()
        self.servers: list[RedisServer] = []
        self.clients: list[redis.Redis] = []
        self.procs: list[tuple[str, Any, int]] = []  # name, Popen, metrics port
        self.shards: Shards | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> "ShardFleet":
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.count):
                self.servers.append(RedisServer(self.workdir / f"redis-{i}", appendonly=True,
                                                appendfsync=self.appendfsync,
                                                settings=deploy_tuning()).start())
            self.clients = [redis.Redis.from_url(u) for u in self.urls]
            self.shards = Shards(self.clients, self.keys)
            for i in range(self.count):
                self._spawn(f"dispatcher-{i}", i, ["dispatcher", "--partitions", str(self.partitions)])
            self._wait(self._placed, "the placement written and every partition's lease held")
            for i in range(self.count):
                for w in range(self.workers):
                    self._spawn(f"worker-{i}-{w}", i, ["worker"])
            self._wait(lambda: all(int(r.scard("rq:workers")) >= self.workers for r in self.clients),
                       "the workers registering")
            self.shards.refresh()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, shard: int, args: list[str]) -> None:
        port = free_port()
        if self.count == 1:
            urls, shard_args = [self.urls[shard]], []
        else:
            urls, shard_args = self.urls, ["--shard", str(shard)]
        env = {"PARLEY_REDIS_URLS": " ".join(urls), "PARLEY_APP": APP, "PARLEY_LOG_LEVEL": "WARNING"}
        popen = start_parley([args[0], *shard_args, *args[1:], "--metrics-port", str(port)], env,
                             self.workdir / f"{name}.log")
        self.procs.append((name, popen, port))

    def _placed(self) -> bool:
        """Every partition's lease held on the shard it is placed on."""
        assert self.shards is not None
        placement = self.shards.refresh() if self.count > 1 else None
        if self.count > 1 and placement is None:
            return False
        for p in range(self.partitions):
            shard = placement.shard_of(p) if placement is not None else 0
            if not self.clients[shard].exists(self.keys.lease(p)):
                return False
        return True

    def _wait(self, ok: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            self.check_alive()
            if time.monotonic() > deadline:
                raise ShardsError(f"timed out waiting for {what}; logs in {self.workdir}")
            time.sleep(0.05)

    def check_alive(self) -> None:
        dead = [f"{name} (exit {p.returncode})" for name, p, _ in self.procs if p.poll() is not None]
        if dead:
            raise ShardsError(f"{', '.join(dead)} exited; logs in {self.workdir}")

    def cpu(self) -> dict[str, float]:
        out = {name: cpu_seconds(p.pid) or 0.0 for name, p, _ in self.procs}
        for i, s in enumerate(self.servers):
            if s.proc is not None:
                out[f"redis-{i}"] = cpu_seconds(s.proc.pid) or 0.0
        out["driver"] = cpu_seconds() or 0.0
        return out

    def rss(self) -> dict[str, int | None]:
        return {name: rss_kib(p.pid) for name, p, _ in self.procs}

    def metrics_up(self) -> bool:
        for _name, _p, port in self.procs:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    pass
            except OSError:
                return False
        return True

    def stop(self) -> None:
        for _name, p, _port in self.procs:
            stop_process(p)
        self.procs.clear()
        for r in self.clients:
            r.close()
        for s in self.servers:
            s.stop()


def shards_row(workdir: Path, shards: int, sessions: int, parked: int, workers: int, partitions: int,
               timeout: float, idempotency_keys: bool) -> dict[str, Any]:
    """One row: `sessions` seed cycles over `shards` shards (all sent at once, each resumed as
    soon as it parks), then `parked` more sessions parked and left open; per shard, how many
    of each and the shard's Redis memory."""
    fleet = ShardFleet(workdir, shards, workers, partitions).start()
    try:
        assert fleet.shards is not None
        producer = RoutedProducer(fleet.shards, partitions, idempotency_keys)
        tracks = [Track(f"sh{shards}-{i}") for i in range(sessions)]
        cpu0, busy0 = fleet.cpu(), machine_busy_seconds()
        wall = run_flow(producer, tracks, timeout, fleet.check_alive)
        cpu1, busy1 = fleet.cpu(), machine_busy_seconds()
        per_shard: list[dict[str, Any]] = [{"shard": i, "sessions": 0, "last_completed_ms": 0}
                                          for i in range(shards)]
        first_ms = min(t.message_ms for t in tracks if t.message_ms is not None)
        for t in tracks:
            row = per_shard[producer.shard_of(t.session)]
            row["sessions"] += 1
            row["last_completed_ms"] = max(row["last_completed_ms"], t.completed_at or 0)
        for row in per_shard:
            # a shard's own rate: its sessions over the time from the first send to its last end
            own_s = max(0.001, (row.pop("last_completed_ms") - first_ms) / 1000)
            row["sessions_per_s"] = round(row["sessions"] / own_s, 1) if row["sessions"] else 0.0
        used = {k: round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1}
        # what else ran meanwhile (the machine is shared): its busy time less ours, in cores
        other = max(0.0, (busy1 - busy0) - sum(used.values())) / wall if wall > 0 else 0.0
        problems = [f"{t.session}: {t.problem}" for t in tracks if t.problem]

        # parked sessions: sent, parked, left open; how they spread and what each shard holds
        mem0 = [int(r.info("memory")["used_memory"]) for r in fleet.clients]
        park_tracks = [Track(f"sh{shards}-park-{i}") for i in range(parked)]
        t0 = time.monotonic()
        producer.send_messages(park_tracks)
        deadline = t0 + timeout
        while sum(int(r.zcard(fleet.keys.interrupt_index)) for r in fleet.clients) < parked:
            fleet.check_alive()
            if time.monotonic() > deadline:
                raise ShardsError(f"sessions not all parked within {timeout:.0f}s; logs in {workdir}")
            time.sleep(0.1)
        park_wall = time.monotonic() - t0
        for i, r in enumerate(fleet.clients):
            open_here = int(r.zcard(fleet.keys.interrupt_index))
            grew = int(r.info("memory")["used_memory"]) - mem0[i]
            per_session = round(grew / open_here) if open_here else None
            per_shard[i].update(parked=open_here, used_memory_per_parked_session=per_session)
        return {
            "shards": shards,
            "mode": "--shard" if shards > 1 else "one Redis",
            "partitions": partitions, "dispatchers": shards, "workers": shards * workers,
            "sessions": sessions, "wall_s": round(wall, 2), "sessions_per_s": round(sessions / wall, 1),
            "problems": len(problems), "problem_examples": problems[:5],
            "parked": parked, "park_wall_s": round(park_wall, 2),
            "parks_per_s": round(parked / park_wall, 1) if park_wall > 0 else None,
            "per_shard": per_shard,
            "usage": {"cpu_s": used, "machine_busy_s": round(busy1 - busy0, 2),
                      "cores_busy": round((busy1 - busy0) / wall, 2) if wall > 0 else None,
                      "other_load_cores": round(other, 2),
                      "cpu_ms_per_session": round(sum(used.values()) * 1000 / sessions, 2)},
            "rss_kib": fleet.rss(),
        }
    finally:
        fleet.stop()
