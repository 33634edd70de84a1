"""Failover without loss: a Sentinel-managed Redis whose primary is killed -9 mid-run.

One primary, one replica, three sentinels (tests/replica_set.py); dispatchers and workers are
given the `redis+sentinel://` URL and must follow the promoted replica by themselves. The old
primary is then started again, empty, and the sentinels make it the new primary's replica (a
replaced node), so `--replica-acks 1` can be met again.

With `--replica-acks 1` and careful producers (each input sent, then `WAIT 1` on the same
connection, sent again with its idempotency key until a replica has it): every session
finishes, and the chaos driver's checks hold for each (tests/chaos/run_chaos.py: its input
applied once, one delivered resume, no duplicate message, the transcript complete, each tool
call settled once and its body run no more than allowed), and no bookkeeping is left behind.

Without `--replica-acks`, what a failover may lose is what the primary had not yet passed to
its replica: an acknowledgement without its transition, or a transition whose jobs were
enqueued. A given run may lose nothing, so only what is certain is asserted: the processes
follow the promoted replica and sessions started after the failover finish.
"""

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.cli.procs import stop_process
from parley.client import Client
from parley.producer import input_fields
from parley.shards import connect
from tests.chaos.run_chaos import APP, check, drive, leftovers
from tests.conftest import Procs
from tests.replica_set import ReplicaSet

#: how long a careful producer waits for a replica to hold its input
PRODUCER_WAIT_MS = 2000


class CarefulClient(Client):
    """A producer that counts an input as sent once a replica holds it: XADD then WAIT 1, in
    one pipeline (WAIT waits for the writes of its own connection). Not yet on a replica: sent
    again, its idempotency key making the copy a no-op if the first one survives."""

    def send(self, session: str, value: Any, idempotency_key: str | None = None,  # type: ignore[override]
             principal: str | None = None, key: str | None = None) -> str:
        assert idempotency_key is not None, "a careful producer resends: it needs a key"
        fields = input_fields(session, value, idempotency_key, principal, key)
        while True:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(self.stream_for(session), fields)
            pipe.execute_command("WAIT", 1, PRODUCER_WAIT_MS)
            entry, replicas = pipe.execute()
            if int(replicas) >= 1:
                return str(entry.decode() if isinstance(entry, bytes) else entry)


@pytest.fixture
def replica_set(tmp_path: Path) -> Iterator[ReplicaSet]:
    rs = ReplicaSet(tmp_path / "redis").start()
    yield rs
    rs.stop()


@pytest.fixture
def fleet(replica_set: ReplicaSet, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Procs]:
    p = Procs(replica_set.url, tmp_path)
    yield p
    codes = [stop_process(proc, timeout=20) for _kind, proc, _log in p.started]
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(p.logs())
    # SIGTERM must end every process cleanly (exit 0), after the failover as before it
    assert all(code == 0 for code in codes), f"exit codes {codes}\n{p.logs()}"


def start_fleet(fleet: Procs, *dispatcher_args: str, careful: bool = False) -> None:
    """Two dispatchers, two workers; `careful`: the tool bodies' records wait for a replica."""
    for _ in range(2):
        fleet.dispatcher(APP, "--partitions", "2", "--lease-ms", "3000", *dispatcher_args)
    for _ in range(2):
        fleet.start("worker", APP, env={"CHAOS_WAIT_REPLICAS": "1" if careful else "0"})


def wait_started(client: Client, within_s: float = 30) -> None:
    """Until both dispatchers and both workers are up: a process starting while Redis is away
    exits (69) as it always does; a failover is what running processes must live through."""
    deadline = time.monotonic() + within_s
    while int(client.redis.zcard(client.keys.dispatchers)) < 2 or int(client.redis.scard("rq:workers")) < 2:
        assert time.monotonic() < deadline, "the fleet did not start"
        time.sleep(0.05)


def fail_over(rs: ReplicaSet, after: threading.Event, done: list[str]) -> None:
    """Once `after` is set: kill -9 the primary, wait for a promotion, start the old one again
    as the new primary's replica."""
    after.wait(60)
    old = rs.kill_primary()
    new = rs.wait_promoted(old)
    rs.rejoin(old, new)
    done.append(f"{old.port}->{new.port}")


def run_sessions(client: Client, sessions: list[str], rs: ReplicaSet, kill_when_sent: int,
                 timeout_s: float) -> tuple[dict[str, str], list[str]]:
    """Drive `sessions` (the chaos driver's seed and tool sessions) while the primary is killed
    once `kill_when_sent` of them have been sent; returns their states and the failover done."""
    rng = random.Random(19)
    stop = threading.Event()
    kill = threading.Event()
    done: list[str] = []
    original = client.send
    sent: list[str] = []

    def counting_send(session: str, *args: Any, **kwargs: Any) -> str:
        entry = original(session, *args, **kwargs)
        sent.append(session)
        if len(sent) >= kill_when_sent:
            kill.set()
        return entry

    client.send = counting_send  # type: ignore[method-assign]
    killer = threading.Thread(target=fail_over, args=(rs, kill, done), daemon=True)
    killer.start()
    state = drive(client, sessions, spread_s=4, deadline=time.monotonic() + timeout_s, stop=stop, rng=rng)
    killer.join(60)
    return state, done


def sessions_of(n: int) -> list[str]:
    out = []
    for i in range(n):
        out.append(f"chaos-{i}")
        if i % 2 == 0:
            out.append(f"tools-{i}")
    return out


def test_with_replica_acks_a_failover_loses_no_acknowledged_transition(
        replica_set: ReplicaSet, fleet: Procs) -> None:
    start_fleet(fleet, "--replica-acks", "1", "--replica-ack-timeout-ms", "500", careful=True)
    client = CarefulClient(connect(replica_set.url, socket_timeout=5))
    wait_started(client)
    sessions = sessions_of(12)
    state, done = run_sessions(client, sessions, replica_set, kill_when_sent=len(sessions) // 2,
                               timeout_s=45)
    assert done, "no failover happened"
    assert {s: v for s, v in state.items() if v != "done"} == {}, fleet.logs()
    tally: Counter[str] = Counter()
    problems = {s: p for s in sessions if (p := check(client, s, tally))}
    assert problems == {}
    assert leftovers(client) == []
    assert all(proc.poll() is None for _kind, proc, _log in fleet.started), "a process died"


def test_without_replica_acks_processes_follow_the_promoted_replica(
        replica_set: ReplicaSet, fleet: Procs) -> None:
    """What is certain without --replica-acks: the fleet follows the new primary. What was not
    yet replicated when the primary died may be lost (docs/operations.md): not asserted."""
    start_fleet(fleet)
    client = Client(connect(replica_set.url, socket_timeout=5))
    wait_started(client)
    old = replica_set.kill_primary()
    new = replica_set.wait_promoted(old)
    replica_set.rejoin(old, new)
    sessions = sessions_of(4)
    state = drive(client, sessions, spread_s=1, deadline=time.monotonic() + 40, stop=threading.Event(),
                  rng=random.Random(5))
    assert {s: v for s, v in state.items() if v != "done"} == {}, fleet.logs()
    tally: Counter[str] = Counter()
    assert {s: p for s in sessions if (p := check(client, s, tally))} == {}
    assert all(proc.poll() is None for _kind, proc, _log in fleet.started), "a process died"
