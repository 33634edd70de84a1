"""A fleet that grows while it runs: many small shards on one box, more added under load.

    python -m tests.chaos.run_fleet --lose 0              (make fleet: 16 shards + 4, 64 partitions)
    python -m tests.chaos.run_fleet --shards 4 --add 2 --partitions 16 --sessions 40 --lose 0
                                                          (make fleet-smoke)

Every shard is a redis-server as deployed (tests/deployed.py: the shipped redis.conf and
users.acl, `maxmemory` small), with one `parley dispatcher --shard i` and one `parley worker
--shard i` under their shipped logins, every process given every shard's URL in order. The
driver plays the seed scenario on every session ("Email bob@example.com: ..." raises the
`confirm` interrupt, which is answered approved, and the turn completes): a sender sends new
sessions through the producer login (producer `app`, through each shard's submit function), a
resumer lists the open interrupts over every shard (the reader login: one page fans out to
every shard at once) and answers each through the producer login.

While they run, `--add` new, empty shards are started and joined with `parley partitions
add-shards` (the harness's admin, an operator's login), their dispatchers and workers started,
the sender and resumer given the new URLs, and `parley partitions rebalance --yes --parallel
K` spreads the partitions evenly over every shard, several moves at once. The sender goes on
throughout; then every session must finish. With `--lose S`, shard S is then killed for good
(its Redis and its processes, -9): the sender skips the sessions it would route there, the
resumer's listing pages go on without it (and say so), `partitions list` answers and one
partition moves between two other shards, with the control plane read and written on the
majority; every session of the other shards must finish.

Checked for every session (on the shard the final table names): its message applied once, one
`confirm` interrupt raised and resumed once, one completed turn, no refused input, its keys on
that shard only; the table even (each shard N // S or N // S + 1 partitions, none moving);
each move's freeze time is printed and kept in `fleet.json` of the work directory (a file
outside every Redis), with the listing's page times at the first and the final shard count.
Exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer, parley_command, start_parley, stop_processes
from parley.schemas.keys import Keys
from parley.schemas.shards import PlacementError
from tests.deployed import (
    DISPATCHER,
    PRODUCER,
    PRODUCER_NAME,
    READER,
    WORKER,
    deployed_redis,
    login,
    ready_for_producers,
    urls_as,
)

ROOT = Path(__file__).resolve().parents[2]
APP = "examples.seed_app"
KEYS = Keys()
MESSAGE = "Email bob@example.com: the launch moved to Friday."
#: a small shard: the fleet is many small units, as the issue's deployment is
MAXMEMORY = "64mb"


def args_of(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=16, help="shards at the start")
    ap.add_argument("--add", type=int, default=4, help="shards added under load")
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=320, help="seed sessions sent in all")
    ap.add_argument("--parallel", type=int, default=4, help="moves at once in the rebalance")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for every session to finish")
    ap.add_argument("--lose", type=int, default=None,
                    help="after the rebalance, kill this shard for good (its Redis and processes, -9)")
    ap.add_argument("--workdir", type=Path, default=None)
    return ap.parse_args(argv)


class Fleet:
    """The shards' servers and their processes."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.servers: list[RedisServer] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.of_shard: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.env = {**os.environ, "PARLEY_APP": APP, "PARLEY_LOG_LEVEL": "INFO",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def add_servers(self, count: int) -> None:
        for _ in range(count):
            i = len(self.servers)
            server = deployed_redis(self.workdir / f"shard{i}")
            server.settings["maxmemory"] = MAXMEMORY
            self.servers.append(server.start())

    def urls_as(self, user: str | None) -> list[str]:
        return urls_as(self.servers, user)

    def start_shard(self, shard: int, partitions: int) -> None:
        """The shard's dispatcher and worker, given every shard's URL so far."""
        dispatcher = ["--partitions", str(partitions), "--lease-ms", "3000",
                      "--register-producer", PRODUCER_NAME]
        for kind, user, extra in (("dispatcher", DISPATCHER, dispatcher), ("worker", WORKER, [])):
            env = {**self.env, "PARLEY_REDIS_URLS": " ".join(self.urls_as(user))}
            log = self.workdir / f"{kind}-{shard}.log"
            proc = start_parley([kind, "--shard", str(shard), *extra], env, log)
            self.procs.append(proc)
            self.of_shard.setdefault(shard, []).append(proc)

    def lose(self, shard: int) -> None:
        """The shard's host gone: its Redis and its processes killed -9, for good."""
        for proc in self.of_shard.pop(shard, []):
            proc.kill()
            proc.wait()
            self.procs.remove(proc)
        self.servers[shard].stop(kill=True)

    def parley(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`parley --redis-url ... partitions ...` as an operator runs it (the admin login)."""
        flags = [a for url in self.urls_as(None) for a in ("--redis-url", url)]
        return subprocess.run(parley_command(*flags, "partitions", *args), env=self.env, text=True,
                              capture_output=True, timeout=600, check=False)

    def admin(self) -> Shards:
        return Shards([redis.Redis.from_url(u) for u in self.urls_as(None)], KEYS)

    def stop(self) -> list[int]:
        codes = stop_processes(self.procs, timeout=30)
        for s in self.servers:
            s.stop(kill=True)
        return codes


class Clients:
    """The producer and reader clients over the URLs known now; swapped when shards join."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.lock = threading.Lock()
        self.producer, self.reader = self._make()

    def _make(self) -> tuple[Client, Client]:
        producer = Client(Shards([redis.Redis.from_url(u) for u in self.fleet.urls_as(PRODUCER)], KEYS),
                          producer=PRODUCER_NAME)
        reader = Client(Shards([redis.Redis.from_url(u) for u in self.fleet.urls_as(READER)], KEYS))
        return producer, reader

    def renew(self) -> None:
        made = self._make()
        with self.lock:
            self.producer, self.reader = made

    def now(self) -> tuple[Client, Client]:
        with self.lock:
            return self.producer, self.reader


class Driver:
    """The sender and the resumer, each a thread; what they did, and any error they met."""

    def __init__(self, clients: Clients, sessions: int):
        self.clients = clients
        self.total = sessions
        self.sent: list[str] = []
        self.resumed: dict[str, int] = {}
        self.page_ms: dict[int, list[float]] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.pace = threading.Event()  # set: send freely; clear: hold (between phases)
        self.pace.set()
        #: a shard lost for good: its sessions are not sent to (each send would wait out
        #: redis-py's retries, then fail), and counted
        self.lost: int | None = None
        self.not_sent = 0
        self.unreachable_pages = 0

    def send_loop(self) -> None:
        for i in itertools.count():
            if self.stop.is_set() or len(self.sent) >= self.total:
                return
            self.pace.wait()
            session = f"fleet-{i}"
            try:
                producer, _ = self.clients.now()
                if self.lost is not None and producer.shards.index_of_session(session) == self.lost:
                    self.not_sent += 1
                    continue
                producer.send(session, {"type": "message.create", "content": MESSAGE}, f"{session}-m1")
                self.sent.append(session)
            except (redis.RedisError, PlacementError) as exc:
                self.errors.append(f"send {session}: {exc!r}")
                return
            time.sleep(0.05)

    def resume_loop(self) -> None:
        while not self.stop.is_set():
            producer, reader = self.clients.now()
            try:
                rows, cursor = [], None
                while True:  # page by page: a page goes on without a shard that does not answer
                    t = time.perf_counter()
                    page = reader.interrupt_page(limit=100, cursor=cursor)
                    self.page_ms.setdefault(len(reader.shards.clients), []).append(
                        (time.perf_counter() - t) * 1000)
                    self.unreachable_pages += bool(page.unreachable)
                    rows += page.items
                    cursor = page.cursor
                    if cursor is None:
                        break
                for row in rows:
                    session, interrupt_id = row.session, row.interrupt_id
                    producer.resume(session, interrupt_id, {"approved": True},
                                    idempotency_key=f"{session}-{interrupt_id}-yes")
                    self.resumed[session] = self.resumed.get(session, 0) + 1
            except PlacementError:
                time.sleep(0.1)  # shards just joined: the clients are renewed in a moment
                continue
            except redis.RedisError as exc:
                self.errors.append(f"resume: {exc!r}")
                return
            time.sleep(0.2)


def events_of(reader: Client, session: str) -> list[dict[str, Any]]:
    return [e for _id, e in reader.events(session, block_ms=1, until=time.monotonic() + 0.05)]


def check_session(reader: Client, admin: Shards, session: str, lost: int | None = None) -> list[str]:
    events = events_of(reader, session)
    kinds = [e["type"] for e in events]
    users = [e for e in events if e["type"] == "message.created" and e["message"]["role"] == "user"]
    bad = []
    if len(users) != 1 or kinds.count("turn.completed") != 1 or kinds.count("interrupt.raised") != 1 \
            or kinds.count("interrupt.resumed") != 1 or "input.refused" in kinds:
        bad.append(f"{session}: {kinds}")
    placement = admin.placement
    assert placement is not None
    on = placement.shard_of_session(session)
    held = [i for i, c in enumerate(admin.clients) if i != lost and c.exists(KEYS.meta(session))]
    if held != [on]:
        bad.append(f"{session}: its record is on shard(s) {held}, the table says {on}")
    return bad


def wait_finished(reader_of: Any, sessions: list[str], timeout: float) -> list[str]:
    """The sessions that have not completed their turn within `timeout`."""
    deadline = time.monotonic() + timeout
    left = list(sessions)
    while left and time.monotonic() < deadline:
        _, reader = reader_of()
        left = [s for s in left if "turn.completed" not in {e["type"] for e in events_of(reader, s)}]
        if left:
            time.sleep(1)
    return left


def on_lost(clients: Clients, session: str, lost: int | None) -> bool:
    producer, _ = clients.now()
    return lost is not None and producer.shards.index_of_session(session) == lost


def lose_a_shard(fleet: Fleet, driver: Driver, shard: int, report: dict[str, Any]) -> list[str]:
    """`shard` killed for good under load; then, without it, a partition moved between two live
    shards and the table listed: the control plane read and written on the majority."""
    bad = []
    fleet.lose(shard)
    driver.lost = shard
    report["lost_shard"] = shard
    time.sleep(3)  # sessions go on meanwhile
    listed = fleet.parley("list")
    if listed.returncode != 0 or f"shard(s) [{shard}] do not answer" not in listed.stdout:
        bad.append(f"partitions list without shard {shard}: exit {listed.returncode} {listed.stdout[:300]} "
                   f"{listed.stderr[:300]}")
    admin = fleet.admin()
    placement = admin.refresh()
    assert placement is not None
    live = [s for s in range(placement.shards) if s != shard]
    source, target = live[0], live[1]
    partition = placement.partitions_of(source)[0]
    began = time.monotonic()
    moved = fleet.parley("move", str(partition), "--to", str(target), "--drain-timeout", "30")
    report["move_without_the_shard"] = {"partition": partition, "from": source, "to": target,
                                        "exit": moved.returncode, "s": round(time.monotonic() - began, 2),
                                        "freeze_s": freezes(moved.stdout).get(partition)}
    print(moved.stdout, moved.stderr, flush=True)
    if moved.returncode != 0:
        bad.append(f"a move between live shards without shard {shard}: exit {moved.returncode} "
                   f"{moved.stderr}")
    return bad


def freezes(output: str) -> dict[int, float]:
    return {int(p): float(s) for p, s in re.findall(r"partition (\d+) moved .*frozen ([\d.]+) s\)", output)}


def p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100)[int(q) - 1], 1)


def main(argv: list[str] | None = None) -> int:
    args = args_of(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="parley-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(workdir)
    violations: list[str] = []
    report: dict[str, Any] = {"shards": args.shards, "added": args.add, "partitions": args.partitions}
    started = time.monotonic()
    try:
        fleet.add_servers(args.shards)
        for server in fleet.servers:
            ready_for_producers(redis.Redis.from_url(server.url),
                                redis.Redis.from_url(server.url_as(login(DISPATCHER))))
        for shard in range(args.shards):
            fleet.start_shard(shard, args.partitions)
        admin = fleet.admin()
        deadline = time.monotonic() + 120
        while True:
            try:
                if admin.check() is not None and all(c.hexists(KEYS.producers, PRODUCER_NAME)
                                                     for c in admin.clients):
                    break
            except PlacementError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the fleet did not start")
            time.sleep(0.2)
        report["started_s"] = round(time.monotonic() - started, 1)
        print(f"fleet: {args.shards} shards up in {report['started_s']} s", flush=True)

        clients = Clients(fleet)
        driver = Driver(clients, args.sessions)
        threads = [threading.Thread(target=driver.send_loop, daemon=True),
                   threading.Thread(target=driver.resume_loop, daemon=True)]
        for t in threads:
            t.start()
        while len(driver.sent) < args.sessions // 3 and not driver.errors:
            time.sleep(0.1)

        # shards join under load
        fleet.add_servers(args.add)
        added = fleet.parley("add-shards")
        print(added.stdout.strip(), added.stderr.strip(), flush=True)
        if added.returncode != 0:
            violations.append(f"add-shards exited {added.returncode}: {added.stderr}")
            raise RuntimeError("add-shards failed")
        for server in fleet.servers[args.shards:]:
            ready_for_producers(redis.Redis.from_url(server.url),
                                redis.Redis.from_url(server.url_as(login(DISPATCHER))))
        for shard in range(args.shards, args.shards + args.add):
            fleet.start_shard(shard, args.partitions)
        admin = fleet.admin()
        deadline = time.monotonic() + 120
        while not all(c.hexists(KEYS.producers, PRODUCER_NAME) and c.zcard(KEYS.dispatchers) >= 1
                      for c in admin.clients[args.shards:]):
            if time.monotonic() > deadline:
                raise RuntimeError("the new shards' dispatchers did not start")
            time.sleep(0.2)
        clients.renew()
        began = time.monotonic()
        rebalanced = fleet.parley("rebalance", "--yes", "--parallel", str(args.parallel),
                                  "--drain-timeout", "30")
        report["rebalance_s"] = round(time.monotonic() - began, 1)
        print(rebalanced.stdout, rebalanced.stderr, flush=True)
        if rebalanced.returncode != 0:
            violations.append(f"rebalance exited {rebalanced.returncode}: {rebalanced.stderr}")
        moved = freezes(rebalanced.stdout)
        report["moves"] = len(moved)
        report["freeze_s"] = {str(k): v for k, v in sorted(moved.items())}
        report["freeze_max_s"] = max(moved.values(), default=None)
        placement = admin.refresh()
        assert placement is not None
        counts = [len(placement.partitions_of(s)) for s in range(placement.shards)]
        report["partitions_per_shard"] = counts
        if placement.moving or max(counts) - min(counts) > 1 or placement.shards != args.shards + args.add:
            violations.append(f"the table is not even after the rebalance: {counts}, "
                              f"moving {placement.moving}")

        if args.lose is not None:
            violations += lose_a_shard(fleet, driver, args.lose, report)

        while len(driver.sent) < args.sessions and not driver.errors:
            time.sleep(0.1)
        left = wait_finished(clients.now, [s for s in driver.sent if not on_lost(clients, s, args.lose)],
                             args.timeout)
        driver.stop.set()
        for thread in threads:
            thread.join(30)
        violations += driver.errors
        violations += [f"{s}: not finished within {args.timeout:g} s" for s in left]

        admin.refresh()
        _, reader = clients.now()
        placement = admin.placement
        assert placement is not None
        kept = [s for s in driver.sent if placement.shard_of_session(s) != args.lose]
        report["lost_with_the_shard"] = len(driver.sent) - len(kept)
        for session in kept:
            violations += check_session(reader, admin, session, args.lose)
        report["sessions"] = len(driver.sent)
        report["not_sent_to_the_lost_shard"] = driver.not_sent
        report["listing_pages_without_a_shard"] = driver.unreachable_pages
        report["listing_page_ms"] = {str(k): {"n": len(v), "p50": p(v, 50), "p95": p(v, 95)}
                                     for k, v in sorted(driver.page_ms.items())}
    except Exception as exc:  # reported as a violation, the fleet stopped below
        violations.append(f"the run stopped: {exc!r}")
    finally:
        codes = fleet.stop()
        if any(c != 0 for c in codes):
            violations.append(f"processes that did not stop cleanly: exit codes {codes}")
    report["violations"] = violations
    report["wall_s"] = round(time.monotonic() - started, 1)
    (workdir / "fleet.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    shown = {k: v for k, v in report.items() if k != "freeze_s"}
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    print(f"fleet: {len(violations)} violation(s); report in {workdir / 'fleet.json'}", flush=True)
    for v in violations[:50]:
        print("  VIOLATION", v, flush=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
