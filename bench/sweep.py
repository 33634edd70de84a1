"""Scenario 6: the dispatcher's sweeps with a large backlog and no worker (bench/README.md).

    python -m bench.sweep ping URL SECONDS    (the concurrent client: PING latencies as JSON)

`backlog_row` enqueues `jobs` LLM jobs through Parley's own outbox flush (in-flight records
included) onto a private redis-server, starts a separate process that PINGs Redis in a closed
loop, and runs the dispatcher's sweeps in this process, every one of them due on each tick, for
`ticks` ticks: the time of each tick's sweeps is what a dispatcher's main loop pays for them.
A few jobs are popped first, as by workers that died before recording them, so the sweep also
has losses to post.
"""

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from parley.dispatcher.core import Enqueue
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.leases import Leases
from parley.dispatcher.sweeps import Sweeps
from parley.runtime.procs import RedisServer
from parley.schemas.jobs import JobKind
from parley.schemas.keys import Keys

ROOT = Path(__file__).resolve().parent.parent


class EverySweepDue(Sweeps):
    """Every sweep due on every tick, and every job old enough to count as lost if it left its
    queue unrecorded: the worst a tick can be."""

    UNCLAIMED_AFTER_MS = 0

    def run(self) -> None:
        self.deadlines_checked = self.lost_checked = self.unclaimed_checked = 0.0
        super().run()


def ping(url: str, seconds: float) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    r = redis.Redis.from_url(url)
    r.ping()
    print("ready", flush=True)
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop:
        t = time.perf_counter()
        r.ping()
        lat.append((time.perf_counter() - t) * 1000)
    print(json.dumps(lat))


def commands(r: redis.Redis) -> int:
    """Commands Redis ran, but the pinger's and INFO itself."""
    return sum(v["calls"] for k, v in r.info("commandstats").items()
               if k not in ("cmdstat_info", "cmdstat_ping"))


def backlog_row(workdir: Path, jobs: int, ticks: int, lost: int, settings: dict[str, str],
                dist: Any) -> dict[str, Any]:
    server = RedisServer(workdir, appendonly=True, appendfsync="always", settings=settings).start()
    r = redis.Redis.from_url(server.url)
    # the planted losses are expected: their warning, one per loss, would bury the bench's output
    quiet = logging.getLogger("parley.dispatcher")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        keys = Keys()
        outbox = Outbox(r, keys)
        for start in range(0, jobs, 500):
            outbox.flush_many([(f"backlog-{i}", [Enqueue(
                seq=1, job=JobKind.LLM, work="llm-1", attempt=1, timeout=30, reply_to=keys.results(),
                app=None, args={"request": {"messages": []}})])
                for i in range(start, min(jobs, start + 500))])
        for _ in range(lost):
            r.lpop(f"rq:queue:{keys.queue('llm')}")
        leases = Leases(r, keys, "bench-sweeper", 10_000)
        leases.partitions = 1
        sweeps = EverySweepDue(r, keys, leases)
        sweeps.run()  # loads the scripts
        pinger = subprocess.Popen([sys.executable, "-m", "bench.sweep", "ping", server.url, "3600"],
                                  cwd=ROOT, stdout=subprocess.PIPE)
        assert pinger.stdout is not None and pinger.stdout.readline().strip() == b"ready"
        before, took = commands(r), []
        for _ in range(ticks):
            t = time.perf_counter()
            sweeps.run()
            took.append((time.perf_counter() - t) * 1000)
            time.sleep(0.005)  # a tick's other work; the pinger keeps going
        per_tick = (commands(r) - before) / ticks
        pinger.terminate()
        out, _ = pinger.communicate(timeout=30)
        pings = json.loads(out.splitlines()[-1] if out else b"[]")
        posted = int(r.xlen(keys.results())) if r.exists(keys.results()) else 0
        return {"queued": int(r.llen(f"rq:queue:{keys.queue('llm')}")), "ticks": ticks,
                "sweep_ms_per_tick": dist(took), "max_sweep_ms": round(max(took), 3),
                "redis_commands_per_tick": round(per_tick, 1), "losses_posted": posted,
                "lost_planted": lost, "ping_ms": dist(pings), "pings": len(pings)}
    finally:
        quiet.setLevel(level)
        r.close()
        server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["ping"]:
        ping(sys.argv[2], float(sys.argv[3]))
