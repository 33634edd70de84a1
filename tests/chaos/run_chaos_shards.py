"""Chaos over two shards, with one failover: tests/chaos/run_chaos.py's sessions and checks.

    python -m tests.chaos.run_chaos_shards --sessions 120      (make chaos-shards)
    python -m tests.chaos.run_chaos_shards --sessions 24 ...   (make chaos-shards-smoke, in CI)

Every Redis runs as deployed (tests/deployed.py: the shipped redis.conf and users.acl), every
process under its login (dispatchers `parley-dispatcher`, workers `parley-worker`, the driver's
inputs `parley-producer`, its reads and checks `parley-reader`; the harness admin seeds, checks
the bookkeeping and runs the moves, which no shipped login may). Shard 0 is one redis-server,
restarted once from its AOF mid-run (each session's `ver` counted either side of the kill -9:
none may go back). Shard 1 is Sentinel-managed (a primary, a replica, three sentinels:
tests/replica_set.py, `deployed=True`: the replicas log in as `parley-replica`, the sentinels as
`parley-sentinel`); its
primary is killed -9 once mid-run, its replica held still and cut off for the second before
(so the primary dies holding writes the replica lacks), the replica promoted, and the old
primary started again as the new one's replica. Each shard has two dispatchers and two
workers, started as a user runs them: `parley --redis-url U0 --redis-url U1 dispatcher
--shard i` (`worker --shard i`); shard 1's dispatchers and workers with `--replica-acks 1`.
Every couple of seconds one process is killed -9 and replaced.

Partitions are moved mid-run, each in a window of its own (after shard 0's restart and before
the failover; after the failover), kills going on: the driver runs `parley --redis-url U0
--redis-url U1 partitions move P --to T --drain-timeout 3` as a user would, first for the
partition of shard 0 holding most of the sessions started by then (to shard 1), then, when
the run lasts long enough, one of shard 1's (to shard 0); as each begins, one of its source's
workers is killed -9. A move that exits non-zero is a violation; `parley partitions repair` is
then run so the run can end, and said.

The driver is a careful producer (producer `app`, the shipped producer login's, so its inputs
go through each shard's submit function): it sends each input to its session's shard, and on
shard 1 counts it as sent once `WAIT 1`, in one pipeline with the submit, says a replica holds it, else
sends it again (its idempotency key makes the copy a no-op); refused `moved`, it reads the
placement again and sends to the shard it names. Its event reads follow the placement too
(read again every half second). The tool bodies and the driver record what ran and what was
seen in files outside every Redis (tests/chaos/evidence.py). Then every session is checked as
run_chaos.py checks it, on the shard the placement names at the end (the events the driver
read by id where the session only ever lived on shard 0, by type where shard 1's failover may
have written them again), each shard for leftovers, a moved partition's source for any key or
member of it, every node's log for `CRITICAL` lines and its ACL LOG for refusals; exits 1 on
any violation.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import ResponseError

from parley.client import Client
from parley.client.producer import SubmitUnavailable, input_fields, is_moved, submit_call, submit_error
from parley.client.shards import Shards, connect
from parley.fleet.copying import Copier
from parley.runtime.procs import parley_command, start_parley
from parley.schemas.keys import Keys, partition_of
from parley.schemas.shards import Placement
from tests.chaos.evidence import DRIVER_FILE, AppendOnly, Evidence
from tests.chaos.run_chaos import (
    Fleet,
    Restart,
    acl_denials,
    chaos_arguments,
    check,
    check_closed,
    drive,
    leftovers,
    restart,
)
from tests.deployed import (
    DISPATCHER,
    PRODUCER_NAME,
    READER,
    WORKER,
    deployed_redis,
    login,
    ready_for_producers,
)
from tests.deployed import PRODUCER as PRODUCER_LOGIN
from tests.replica_set import ReplicaSet

#: the producer the shipped producer login sends as (registered by the dispatchers, and before)
PRODUCER = PRODUCER_NAME
PARTITIONS = 4
#: how long the producer waits for shard 1's replica to hold an input
PRODUCER_WAIT_MS = 2000
#: a move's `--drain-timeout`: short, so a job of a worker killed -9 is recorded lost by the move
MOVE_DRAIN_TIMEOUT_S = 3.0
#: how often the driver reads the placement again for its event reads (the sends on `moved`)
REFRESH_EVERY_S = 0.5
#: how long an input may stay refused `moved` before the driver gives up (a move stuck frozen)
MOVED_GIVE_UP_S = 180.0
#: what redis-py puts before the error reply of a command in a pipeline
PIPELINE_ERROR = "of pipeline caused error: "
#: a shard restarting or failing over: the caller waits and tries again
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


class ShardFleet(Fleet):
    """Processes named `<kind>-<shard>-<letter>`, each serving its shard, under its kind's
    login on every shard (`shard_urls[kind]`: each shard's URL, in order)."""

    def __init__(self, shard_urls: dict[str, list[str]], logdir: Path, records: Path):
        super().__init__({kind: urls[0] for kind, urls in shard_urls.items()}, logdir, records)
        self.shard_urls = shard_urls

    def start(self, name: str) -> None:
        kind, shard, _ = name.split("-")
        # not PARLEY_REDIS_URL: the command lines name every shard
        urls = url_args(self.shard_urls[kind])
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

    def kill_worker(self, shard: int, rng: random.Random) -> str:
        """Kill -9 one of `shard`'s workers and start it again."""
        name = rng.choice([n for n in sorted(self.procs) if n.startswith(f"worker-{shard}-")])
        self.procs[name].kill()
        self.procs[name].wait()
        self.kills += 1
        self.start(name)
        return name


class CarefulClient(Client):
    """The producer over every shard: an input counts as sent once `replicas[i]` replicas of its
    shard i hold it; refused `moved` (its partition is being moved, or is elsewhere now), it
    reads the placement again and sends to the shard it names."""

    def __init__(self, shards: Shards, replicas: list[int]):
        super().__init__(shards, producer=PRODUCER)
        self.replicas = replicas
        self.moved_refusals = 0
        self._read_at = 0.0

    def refresh(self, every_s: float = 0.0) -> None:
        """Read the placement again (at most every `every_s`): the shard of each session as a
        move left it, for the event reads and the final checks."""
        now = time.monotonic()
        if now - self._read_at < every_s:
            return
        try:
            self.shards.refresh()
            self._read_at = now
        except REDIS_DOWN:  # a shard restarting or failing over: the table read last still routes
            pass

    def send(self, session: str, value: Any, idempotency_key: str | None = None,
             principal: str | None = None, key: str | None = None) -> str:
        fields = input_fields(session, value, idempotency_key, principal, key)
        assert self.producer is not None
        moved_since: float | None = None
        while True:
            shard = self.shards.index_of_session(session)
            call = submit_call(self.keys, self.producer, session, self.partitions(shard), fields)
            # The submit and its WAIT in ONE pipeline, so on one connection: WAIT waits for the
            # writes of its own connection, and a reconnect between two separate commands would
            # put the WAIT on a fresh connection that wrote nothing (it would answer at once).
            pipe = self.shards.clients[shard].pipeline(transaction=False)
            pipe.fcall(*call)
            pipe.execute_command("WAIT", self.replicas[shard], PRODUCER_WAIT_MS)
            try:
                entry, replicas = pipe.execute()
            except ResponseError as err:
                # redis-py prefixes a pipeline's error reply with the command that failed
                error = submit_error(str(err).split(PIPELINE_ERROR, 1)[-1]) or err
                if isinstance(error, SubmitUnavailable):  # a Redis back empty: a dispatcher loads it soon
                    time.sleep(0.1)
                    continue
                if not is_moved(error):
                    raise error from None
                # nothing was written: the move goes on, or it is done and the table read is old
                self.moved_refusals += 1
                moved_since = moved_since or time.monotonic()
                if time.monotonic() - moved_since > MOVED_GIVE_UP_S:
                    raise RuntimeError(f"{session}: refused `moved` for {MOVED_GIVE_UP_S:g} s") from None
                time.sleep(0.1)
                self.refresh()
                continue
            except REDIS_DOWN:  # the failover: send again
                time.sleep(0.1)
                continue
            if int(replicas) >= self.replicas[shard]:
                return str(entry.decode() if isinstance(entry, bytes) else entry)


@dataclass
class Move:
    """One `parley partitions move`, run by the driver, and what it printed."""

    partition: int
    source: int
    target: int
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    seconds: float = 0.0
    code: int | None = None
    sessions: int | None = None
    forced_lost: int | None = None
    repair: str | None = None  # `parley partitions repair`'s output, when the move failed

    def done(self) -> bool:
        return self.proc.poll() is not None

    def finish(self, urls: list[str]) -> None:
        """Wait for the command; read its figures; after a failure, repair what it left."""
        self.code = self.proc.wait()
        self.seconds = time.monotonic() - self.started
        out = self.output()
        if m := re.search(r"^copy: (\d+) sessions", out, re.M):
            self.sessions = int(m.group(1))
        if m := re.search(r"^drain: jobs drained \((\d+) recorded lost", out, re.M):
            self.forced_lost = int(m.group(1))
        if self.code != 0:
            done = subprocess.run(parley_command(*url_args(urls), "partitions", "repair"),
                                  capture_output=True, text=True, timeout=300)
            self.repair = f"exit {done.returncode}: {(done.stdout + done.stderr).strip()}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def summary(self) -> str:
        text = (f"partition {self.partition} {self.source}->{self.target}: exit {self.code}, "
                f"{self.seconds:.1f} s, sessions moved {self.sessions}, drain's forced losses "
                f"{self.forced_lost}")
        return text + (f"; repaired ({self.repair})" if self.repair is not None else "")


def url_args(urls: list[str]) -> list[str]:
    return [a for u in urls for a in ("--redis-url", u)]


def start_move(urls: list[str], partition: int, source: int, target: int, logdir: Path) -> Move:
    log = logdir / f"move-{partition}-to-{target}.log"
    proc = start_parley([*url_args(urls), "partitions", "move", str(partition), "--to", str(target),
                         "--drain-timeout", str(MOVE_DRAIN_TIMEOUT_S)], {}, log)
    return Move(partition, source, target, proc, log, time.monotonic())


def busiest(placement: Placement, shard: int, started: list[str], exclude: set[int]) -> int | None:
    """The partition `shard` serves that holds most of the sessions started so far."""
    on = Counter(partition_of(s, placement.partitions) for s in started)
    candidates = [p for p in placement.partitions_of(shard) if p not in exclude and on[p]]
    return max(candidates, key=lambda p: (on[p], -p)) if candidates else None


def left_on_source(shards: Shards, move: Move) -> list[str]:
    """Anything of the moved partition still on its source: a key of its sessions, one of its
    streams, a member of a shard-wide set. A job that outlived the drain may post its late
    outcome there (docs/operations.md): the results stream is allowed back only then."""
    copier = Copier(shards.keys)
    r, p = shards.clients[move.source], move.partition
    found = [k for _s, k in copier.session_keys_of(r, p, PARTITIONS)]
    results = shards.keys.results(p, PARTITIONS)
    found += [k for k in copier.streams_of(r, p, PARTITIONS)
              if r.exists(k) and not (k == results and move.forced_lost)]
    found += [f"{name}: {len(items)} members" for name, _holds, items in copier.members_of(r, p, PARTITIONS)]
    return found


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
    args = chaos_arguments(__doc__ or "", sessions=120, spread=45.0, close_fraction=0.2)
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="parley-chaos-shards-"))
    records = workdir / "records"
    records.mkdir()
    # as deployed: the shipped redis.conf and users.acl on shard 0 and on every node of shard 1,
    # whose replicas and sentinels log in with the shipped parley-replica / parley-sentinel
    shard0 = deployed_redis(workdir / "shard0").start()
    shard1 = ReplicaSet(workdir / "shard1", deployed=True).start()

    def urls_as(user: str) -> list[str]:
        return [shard0.url_as(login(user)), shard1.url_as(login(user))]

    # the harness's admin: seeding, the bookkeeping checks, `parley partitions move` (no shipped
    # login may move a partition: deploy/README.md, "What the patterns cannot say")
    urls = [shard0.url, shard1.url]
    shards = Shards([connect(u, socket_timeout=5) for u in urls], Keys())
    for admin, as_dispatcher in zip(shards.clients, urls_as(DISPATCHER), strict=True):
        ready_for_producers(admin, connect(as_dispatcher, socket_timeout=5))
    fleet = ShardFleet({"dispatcher": urls_as(DISPATCHER), "worker": urls_as(WORKER)}, workdir, records)
    for name in ("dispatcher-0-a", "dispatcher-0-b", "dispatcher-1-a", "dispatcher-1-b",
                 "worker-0-a", "worker-0-b", "worker-1-a", "worker-1-b"):
        fleet.start(name)
    wait_started(shards)
    shards.check()  # the placement the dispatchers wrote: how sessions are routed
    initial = shards.placement
    assert initial is not None
    # the driver's inputs through the producer login, as producer `app`
    careful = CarefulClient(Shards([connect(u, socket_timeout=5) for u in urls_as(PRODUCER_LOGIN)], Keys()),
                            replicas=[0, 1])
    careful.refresh()

    def route(_session: str) -> Client:
        careful.refresh(REFRESH_EVERY_S)  # a moved session's events are read on its new shard
        return careful

    tool_sessions = args.sessions // 2 if args.tool_sessions is None else args.tool_sessions
    sessions = [f"chaos-{i}" for i in range(args.sessions)]
    for i in range(tool_sessions):
        sessions.insert(min(len(sessions), 3 * i + 1), f"tools-{i}")
    closing = frozenset(rng.sample(sessions, round(len(sessions) * args.close_fraction)))
    stop = threading.Event()
    events: list[str] = []
    moves: list[Move] = []
    restarts: list[Restart] = []
    # the second move no earlier than this far into the run: the sessions started by then spread
    # over every partition, and the ones started later are sent while it runs
    second_move_at = 0.6 * args.spread

    def move(source: int, target: int, elapsed: float) -> None:
        """Start moving the busiest partition of `source` to `target` (its own placement read:
        this thread's, not the driver's)."""
        placement = Shards([connect(u, socket_timeout=5) for u in urls], Keys()).refresh()
        assert placement is not None
        started = sessions[:int(len(sessions) * min(1.0, elapsed / max(args.spread, 0.1))) + 1]
        p = busiest(placement, source, started, {m.partition for m in moves})
        if p is not None:  # none yet with a started session: asked again at the next tick
            moves.append(start_move(urls, p, source, target, workdir))
            events.append(f"move-{p}")
            # as the move begins, a worker of the source: a job of P it ran is drained only at
            # the timeout (the source's sweeps leave P alone), recorded lost, retried on the target
            fleet.kill_worker(source, rng)

    def chaos() -> None:
        started = time.monotonic()
        while not stop.wait(args.kill_every * rng.uniform(0.5, 1.5)):
            elapsed = time.monotonic() - started
            if moves and moves[-1].code is None and moves[-1].done():
                moves[-1].finish(urls)
                events.append(f"moved-{moves[-1].partition}")
            if moves and moves[-1].code is None:  # kills go on; a restart or failover waits for its end
                fleet.kill_one(rng)
            elif "restart" not in events and elapsed > 5:
                # kill -9 (appendfsync always keeps every ack), each session's `ver` counted
                restarts.append(restart(shard0, shards.clients[0], shards.keys, sessions))
                events.append("restart")
            elif not moves and "restart" in events:
                move(0, 1, elapsed)
            elif "failover" not in events and moves and elapsed > 10:
                # the replica held still and cut off first: the primary dies holding writes
                # the promoted replica never saw (at a random moment, loopback loses nothing)
                old = shard1.kill_primary_behind(1.2)
                new = shard1.wait_promoted(old)
                shard1.rejoin(old, new)
                events.append("failover")
            elif len(moves) == 1 and "failover" in events and elapsed > second_move_at:
                move(1, 0, elapsed)
            else:
                fleet.kill_one(rng)
        if moves and moves[-1].code is None:  # the sessions finished during a move: its end first
            moves[-1].finish(urls)
            events.append(f"moved-{moves[-1].partition}")

    chaos_thread = threading.Thread(target=chaos, daemon=True)
    t0 = time.monotonic()
    chaos_thread.start()
    journal = AppendOnly(records / DRIVER_FILE)
    state = drive(careful, sessions, args.spread, t0 + args.timeout, stop, rng, closing, route=route,
                  journal=journal)
    chaos_thread.join()
    journal.close()
    elapsed = time.monotonic() - t0
    shards.refresh()  # the checks read each session where the placement says it is now
    final = shards.placement
    assert final is not None
    # the checks read as `parley show` does, under the reader login
    reader = Client(Shards([connect(u, socket_timeout=5) for u in urls_as(READER)], Keys()))
    reader.shards.refresh()
    evidence = Evidence.load(records)
    violations: dict[str, list[str]] = {}
    tally: Counter[str] = Counter()
    for s in sessions:
        # events read on shard 0 alone keep their ids; shard 1's failover may write a lost
        # transition's events again with new ids: compared by type there
        same_ids = initial.shard_of_session(s) == 0 and final.shard_of_session(s) == 0
        if s in closing:
            problems = check_closed(reader, s, tally, evidence, same_ids) if state[s] == "closed" else [
                f"not closed (state {state[s]})"]
        else:
            problems = check(reader, s, tally, evidence, same_ids) if state[s] == "done" else [
                f"did not finish (state {state[s]})"]
        if problems:
            violations[s] = problems
    if "failover" not in events:
        violations["failover"] = ["the run ended before shard 1's primary was killed: a longer --spread"]
    if not moves:
        violations["move"] = ["the run ended before a partition was moved: a longer --spread"]
    for m in moves:
        if m.code != 0:
            violations[f"move of partition {m.partition}"] = [f"exit {m.code}: {m.output().strip()}"]
        elif final.shard_of(m.partition) != m.target or m.partition in final.moving:
            violations[f"move of partition {m.partition}"] = [f"placed {final.route(m.partition)} at the end"]
        elif left := left_on_source(shards, m):
            violations[f"move of partition {m.partition}"] = [f"left on shard {m.source}: {left[:10]}"]
    for i, r in enumerate(shards.clients):
        if not violations and (left := leftovers(Client(r))):
            violations[f"leftovers on shard {i}"] = left
    for r in restarts:
        if r.problems():
            violations["shard 0's restart"] = r.problems()
    critical = [f"shard0: {line}" for line in shard0.critical_lines()] + shard1.critical_lines()
    if critical:
        violations["redis logs"] = critical[:5]
    if evidence.torn:
        violations["records"] = [f"{evidence.torn} lines cut short in {records}"]
    nodes = [("shard0", shard0), *((f"shard1 {n.directory.name}", n) for n in shard1.servers)]
    denials = [f"{where}: {d}" for where, node in nodes if node.proc is not None
               for d in acl_denials(redis.Redis.from_url(node.url, socket_timeout=5))]
    if denials:  # a process, replica or sentinel short of a right (RQ swallows some refusals)
        violations["acl log"] = denials[:5]
    for s in sorted(violations)[:3]:
        if s in state:
            seen = [e["type"] for _id, e in reader.events(s, block_ms=1, until=time.monotonic() + 0.2)]
            (workdir / f"{s}.txt").write_text(f"events: {seen}\nview: {reader.show(s)}\n")
    crashed = [name for name, proc in fleet.procs.items() if proc.poll() is not None]
    codes = fleet.stop()
    shard1.stop()
    shard0.stop()
    if crashed or any(codes):
        violations["fleet"] = [f"died on their own: {crashed}", f"exit codes on SIGTERM: {codes}"]
    on = Counter(final.shard_of_session(s) for s in sessions)
    moved = {m.partition for m in moves if m.code == 0}
    print(f"chaos-shards: sessions={len(sessions)} (tool sessions {tool_sessions}, closed {len(closing)}, "
          f"on shard 0: {on[0]}, on shard 1: {on[1]}, in moved partitions: "
          f"{sum(partition_of(s, PARTITIONS) in moved for s in sessions)}) "
          f"finished={sum(v in ('done', 'closed') for v in state.values())} kills={fleet.kills} "
          f"chaos={','.join(events)} violations={len(violations)} critical_lines={len(critical)} "
          f"acl_denials={len(denials)} seconds={elapsed:.1f} exit_codes={codes}")
    for r in restarts:
        print(f"shard 0's restart: {r.summary()}")
    print(f"evidence: {evidence.files} files in {records}, {sum(evidence.runs.values())} tool runs, "
          f"{sum(map(len, evidence.sent.values()))} inputs acknowledged, "
          f"{sum(map(len, evidence.seen.values()))} events read")
    print(f"moves ({careful.moved_refusals} sends refused `moved`, then sent again): "
          + ("; ".join(m.summary() for m in moves) or "none"))
    print("tools: " + ", ".join(f"{k}={v}" for k, v in sorted(tally.items())))
    for s, problems in sorted(violations.items())[:20]:
        print(f"  {s}: {'; '.join(problems)}")
    if violations:
        print(f"logs in {workdir}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
