"""Chaos over two shards, with one failover: tests/chaos/run_chaos.py's sessions and checks.

    python -m tests.chaos.run_chaos_shards --sessions 120      (make chaos-shards)
    python -m tests.chaos.run_chaos_shards --sessions 24 ...   (make chaos-shards-smoke, in CI)

Shard 0 is a plain redis-server (`appendfsync always`), restarted once from its AOF mid-run.
Shard 1 is Sentinel-managed (a primary, a replica, three sentinels: tests/replica_set.py); its
primary is killed -9 once mid-run, its replica held still and cut off for the second before
(so the primary dies holding writes the replica lacks), the replica promoted, and the old
primary started again as the new one's replica. Each shard has two dispatchers and two
workers, started as a user runs them: `parley --redis-url U0 --redis-url U1 dispatcher
--shard i` (`worker --shard i`); shard 1's dispatchers and workers with `--replica-acks 1`.
Every couple of seconds one process is killed -9 and replaced.

The driver is a careful producer (registered as `chaos`, so its inputs go through each
shard's submit function): it sends each input to its session's shard, and on shard 1 counts
it as sent once `WAIT 1`, in one pipeline with the submit, says a replica holds it, else
sends it again (its idempotency key makes the copy a no-op). The tool bodies record their
runs on shard 0. Then every session is checked as run_chaos.py checks it, and each shard for
leftovers; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import ResponseError

from parley.cli.procs import RedisServer, start_parley
from parley.client import Client
from parley.producer import SubmitUnavailable, input_fields, submit_call, submit_error
from parley.schemas.keys import Keys
from parley.shards import Shards, connect
from tests.chaos.run_chaos import APP, Fleet, check, check_closed, drive, leftovers
from tests.replica_set import ReplicaSet

PRODUCER = "chaos"
PARTITIONS = 4
#: how long the producer waits for shard 1's replica to hold an input
PRODUCER_WAIT_MS = 2000


class ShardFleet(Fleet):
    """Processes named `<kind>-<shard>-<letter>`, each serving its shard."""

    def __init__(self, urls: list[str], logdir: Path, records_url: str):
        super().__init__(urls[0], logdir)
        # not PARLEY_REDIS_URL: the command lines name every shard
        self.env = {"PARLEY_APP": APP, "PARLEY_LOG_LEVEL": "WARNING", "CHAOS_RECORDS_URL": records_url}
        self.urls = urls

    def start(self, name: str) -> None:
        kind, shard, _ = name.split("-")
        urls = [a for u in self.urls for a in ("--redis-url", u)]
        if kind == "dispatcher":
            args = ["dispatcher", "--shard", shard, "--partitions", str(PARTITIONS), "--lease-ms", "2000",
                    "--register-producer", PRODUCER]
            if shard == "1":  # the Sentinel-managed shard: nothing acknowledged before its replica has it
                args += ["--replica-acks", "1", "--replica-ack-timeout-ms", "500"]
        else:
            args = ["worker", "--shard", shard]
            if shard == "1":  # an outcome counts as posted once the replica has it
                args += ["--replica-acks", "1"]
        self.n += 1
        self.procs[name] = start_parley([*urls, *args], self.env, self.logdir / f"{name}-{self.n}.log")


class CarefulClient(Client):
    """One shard's producer client: an input counts as sent once `replicas` replicas hold it."""

    def __init__(self, r: redis.Redis, replicas: int):
        super().__init__(r, producer=PRODUCER)
        self.replicas = replicas

    def send(self, session: str, value: Any, idempotency_key: str | None = None,  # type: ignore[override]
             principal: str | None = None, key: str | None = None) -> str:
        fields = input_fields(session, value, idempotency_key, principal, key)
        assert self.producer is not None
        while True:
            call = submit_call(self.keys, self.producer, session, self.partitions(), fields)
            # The submit and its WAIT in ONE pipeline, so on one connection: WAIT waits for the
            # writes of its own connection, and a reconnect between two separate commands would
            # put the WAIT on a fresh connection that wrote nothing (it would answer at once).
            pipe = self.redis.pipeline(transaction=False)
            pipe.fcall(*call)
            pipe.execute_command("WAIT", self.replicas, PRODUCER_WAIT_MS)
            try:
                entry, replicas = pipe.execute()
            except ResponseError as err:
                error = submit_error(str(err)) or err
                if isinstance(error, SubmitUnavailable):  # a Redis back empty: a dispatcher loads it soon
                    time.sleep(0.1)
                    continue
                raise error from None
            except (redis.ConnectionError, redis.TimeoutError):  # the failover: send again
                time.sleep(0.1)
                continue
            if int(replicas) >= self.replicas:
                return str(entry.decode() if isinstance(entry, bytes) else entry)


def wait_started(shards: Shards, within_s: float = 60) -> None:
    """Both dispatchers and both workers of each shard up, the producer registered."""
    keys = shards.keys
    deadline = time.monotonic() + within_s
    for r in shards.clients:
        while (int(r.zcard(keys.dispatchers)) < 2 or int(r.scard("rq:workers")) < 2
               or not r.hexists(keys.producers, PRODUCER)):
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not start")
            time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=120, help="seed sessions")
    parser.add_argument("--tool-sessions", type=int, default=None,
                        help="sessions running the recording tools (default: half --sessions)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--spread", type=float, default=45.0, help="seconds over which sessions start")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--close-fraction", type=float, default=0.2,
                        help="share of the sessions (of both kinds) closed at a random moment")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="parley-chaos-shards-"))
    shard0 = RedisServer(workdir / "shard0", appendonly=True, appendfsync="always").start()
    shard1 = ReplicaSet(workdir / "shard1").start()
    urls = [shard0.url, shard1.url]
    shards = Shards([connect(u, socket_timeout=5) for u in urls], Keys())
    fleet = ShardFleet(urls, workdir, records_url=shard0.url)
    for name in ("dispatcher-0-a", "dispatcher-0-b", "dispatcher-1-a", "dispatcher-1-b",
                 "worker-0-a", "worker-0-b", "worker-1-a", "worker-1-b"):
        fleet.start(name)
    wait_started(shards)
    shards.check()  # the placement the dispatchers wrote: how sessions are routed
    clients = [CarefulClient(r, replicas=i) for i, r in enumerate(shards.clients)]

    def route(session: str) -> Client:
        return clients[shards.index_of_session(session)]

    tool_sessions = args.sessions // 2 if args.tool_sessions is None else args.tool_sessions
    sessions = [f"chaos-{i}" for i in range(args.sessions)]
    for i in range(tool_sessions):
        sessions.insert(min(len(sessions), 3 * i + 1), f"tools-{i}")
    closing = frozenset(rng.sample(sessions, round(len(sessions) * args.close_fraction)))
    stop = threading.Event()
    events: list[str] = []

    def chaos() -> None:
        started = time.monotonic()
        while not stop.wait(args.kill_every * rng.uniform(0.5, 1.5)):
            elapsed = time.monotonic() - started
            if "restart" not in events and elapsed > 5:
                shard0.stop(kill=True)  # kill -9: appendfsync always keeps every ack
                time.sleep(0.5)
                shard0.start()
                events.append("restart")
            elif "failover" not in events and elapsed > 10:
                # the replica held still and cut off first: the primary dies holding writes
                # the promoted replica never saw (at a random moment, loopback loses nothing)
                old = shard1.kill_primary_behind(1.2)
                new = shard1.wait_promoted(old)
                shard1.rejoin(old, new)
                events.append("failover")
            else:
                fleet.kill_one(rng)

    chaos_thread = threading.Thread(target=chaos, daemon=True)
    t0 = time.monotonic()
    chaos_thread.start()
    state = drive(clients[0], sessions, args.spread, t0 + args.timeout, stop, rng, closing, route=route)
    chaos_thread.join()
    elapsed = time.monotonic() - t0
    records = shards.clients[0]
    violations: dict[str, list[str]] = {}
    tally: Counter[str] = Counter()
    for s in sessions:
        if s in closing:
            problems = check_closed(route(s), s, tally, records) if state[s] == "closed" else [
                f"not closed (state {state[s]})"]
        else:
            problems = check(route(s), s, tally, records) if state[s] == "done" else [
                f"did not finish (state {state[s]})"]
        if problems:
            violations[s] = problems
    if "failover" not in events:
        violations["failover"] = ["the run ended before shard 1's primary was killed: a longer --spread"]
    for i, c in enumerate(clients):
        if not violations and (left := leftovers(c)):
            violations[f"leftovers on shard {i}"] = left
    for s in sorted(violations)[:3]:
        if s in state:
            c = route(s)
            seen = [e["type"] for _id, e in c.events(s, block_ms=1, until=time.monotonic() + 0.2)]
            (workdir / f"{s}.txt").write_text(f"events: {seen}\nview: {c.show(s)}\n")
    crashed = [name for name, proc in fleet.procs.items() if proc.poll() is not None]
    codes = fleet.stop()
    shard1.stop()
    shard0.stop()
    if crashed or any(codes):
        violations["fleet"] = [f"died on their own: {crashed}", f"exit codes on SIGTERM: {codes}"]
    on = Counter(shards.index_of_session(s) for s in sessions)
    print(f"chaos-shards: sessions={len(sessions)} (tool sessions {tool_sessions}, closed {len(closing)}, "
          f"on shard 0: {on[0]}, on shard 1: {on[1]}) "
          f"finished={sum(v in ('done', 'closed') for v in state.values())} kills={fleet.kills} "
          f"chaos={','.join(events)} violations={len(violations)} seconds={elapsed:.1f} exit_codes={codes}")
    print("tools: " + ", ".join(f"{k}={v}" for k, v in sorted(tally.items())))
    for s, problems in sorted(violations.items())[:20]:
        print(f"  {s}: {'; '.join(problems)}")
    if violations:
        print(f"logs in {workdir}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
