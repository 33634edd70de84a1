"""A deployment of several shards end to end: `parley dispatcher` and `parley worker` given every
shard's URL start one process per shard (or serve the one `--shard` names), each session is
served on its root's shard, and one shard's trouble (a dispatcher killed, its Redis restarted)
does not stop the others (docs/operations.md, "Shards")."""

import os
import random
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.client import Client
from parley.client.shards import Shards
from parley.runtime.procs import RedisServer, stop_processes
from parley.schemas.keys import Keys
from parley.schemas.shards import Placement
from tests.conftest import ROOT, of_type, wait_for
from tests.forkserver import start_parley

pytestmark = pytest.mark.e2e
KEYS = Keys()


class Deployment:
    """S redis-servers, and the Parley processes started on them (stopped at teardown)."""

    def __init__(self, tmp: Path, shards: int):
        self.tmp = tmp
        self.servers = [RedisServer(tmp / f"shard{i}", appendonly=True).start() for i in range(shards)]
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._shards: Shards | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, kind: str, app: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{kind}-{len(self.started)}.log"
        env = {"PARLEY_REDIS_URLS": " ".join(self.urls), "PARLEY_APP": app, "PARLEY_LOG_LEVEL": "INFO",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = start_parley([kind, *args], env, log)
        self.started.append((proc, log))
        return proc

    def shards(self) -> Shards:
        if self._shards is None:
            self._shards = Shards.from_urls(self.urls, KEYS)
        return self._shards

    def client(self, session: str) -> Client:
        """A client of the session's shard (the placement read once a dispatcher wrote it)."""
        deadline = time.monotonic() + 20
        while self.shards().placement is None:
            if self.shards().refresh() is None:
                assert time.monotonic() < deadline, "no dispatcher wrote the placement\n" + self.logs()
                time.sleep(0.1)
        return Client(self.shards().for_session(session))

    def keys_named(self, shard: int, session: str) -> list[bytes]:
        return list(redis.Redis.from_url(self.urls[shard]).scan_iter(match=f"*{{{session}}}*"))

    def logs(self) -> str:
        return "\n".join(f"----- {log.name} -----\n{log.read_text(errors='replace')[-3000:]}"
                         for _p, log in self.started if log.exists())

    def stop(self) -> list[int]:
        codes = stop_processes([p for p, _log in self.started], timeout=20)
        for s in self.servers:
            s.stop(kill=True)
        return codes


@pytest.fixture
def deploy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    d = Deployment(tmp_path, request.param)
    yield d
    killed = getattr(d, "killed", [])
    d.started = [(p, log) for p, log in d.started if p not in killed]
    codes = d.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(d.logs())
    assert all(code == 0 for code in codes), f"exit codes {codes}\n{d.logs()}"


def placement_of(d: Deployment) -> Placement:
    placement = d.shards().refresh() or d.shards().check()
    assert placement is not None
    return placement


def sessions_on_every_shard(d: Deployment, per_shard: int, tag: str) -> list[str]:
    placement = placement_of(d)
    out: list[str] = []
    for shard in range(len(d.servers)):
        out += [s for n in range(1000) if placement.shard_of_session(s := f"{tag}{n}") == shard][:per_shard]
    return out


def approve_and_finish(d: Deployment, session: str, timeout: float = 30) -> None:
    client = d.client(session)
    raised = wait_for(client, session, lambda e: e["type"] == "interrupt.raised", timeout=timeout)[-1]
    client.send(session, {"type": "interrupt.resume", "interrupt_id": raised["interrupt_id"],
                          "payload": {"approved": True}})
    events = wait_for(client, session, lambda e: e["type"] == "turn.completed", timeout=timeout)
    messages = [e["message"] for e in of_type(events, "message.created")]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["sent"]


def wait_ready(d: Deployment) -> None:
    """The placement written, and every shard served by a dispatcher and a worker: past their
    start-up check, which reads every shard (a test that stops one must wait for this)."""
    d.client("any")
    deadline = time.monotonic() + 30
    for url in d.urls:
        r = redis.Redis.from_url(url)
        while not r.zcard(KEYS.dispatchers) or not r.scard("rq:workers"):
            assert time.monotonic() < deadline, "a shard has no dispatcher or worker\n" + d.logs()
            time.sleep(0.1)


@pytest.mark.parametrize("deploy", [3], indirect=True)
def test_seed_scenario_and_a_deadline_on_three_shards(deploy: Deployment) -> None:
    """One `parley dispatcher` and one `parley worker`: a child per shard each; sessions of
    every shard go through the seed scenario, each only on its own shard; a deadline fires."""
    deploy.start("dispatcher", "tests.apps.scenarios")
    deploy.start("worker", "tests.apps.scenarios")
    wait_ready(deploy)
    placement = deploy.shards().placement
    assert placement is not None and placement.partitions == 16 and placement.shards == 3
    sessions = sessions_on_every_shard(deploy, 1, "seed-")
    for s in sessions:
        deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
    timed = sessions_on_every_shard(deploy, 1, "late-")[1]  # on shard 1
    deploy.client(timed).send(timed, {"type": "message.create", "content": "email bob: [deadline] hi"})
    for s in sessions:
        approve_and_finish(deploy, s)
        home = deploy.shards().index_of_session(s)
        for shard in range(3):
            assert bool(deploy.keys_named(shard, s)) == (shard == home), (s, shard)
    events = wait_for(deploy.client(timed), timed, lambda e: e["type"] == "turn.completed", timeout=30)
    resumed = of_type(events, "interrupt.resumed")
    assert len(resumed) == 1 and resumed[0]["timed_out"] is True


def two_free_ports() -> int:
    """A port P with P+1 free as well (a per-shard command's children serve P and P+1). Taken
    below Linux's ephemeral range (32768-60999): a port of bind(0) is even there, and its odd
    neighbour is the kind connect() hands to the suite's many client sockets meanwhile."""
    for _ in range(50):
        port = random.randrange(20_000, 32_000)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("0.0.0.0", port))
                b.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two free ports in a row")


@pytest.mark.parametrize("deploy", [2], indirect=True)
def test_sub_agents_live_on_their_parents_shard(deploy: Deployment) -> None:
    """Also: each per-shard child serves its own /metrics and health (port P+i)."""
    port = two_free_ports()
    deploy.start("dispatcher", "tests.apps.agents", "--metrics-port", str(port))
    deploy.start("worker", "tests.apps.agents")
    wait_ready(deploy)
    for shard in (0, 1):
        assert urllib.request.urlopen(f"http://127.0.0.1:{port + shard}/healthz", timeout=5).status == 200
    for parent in sessions_on_every_shard(deploy, 1, "p-"):
        client = deploy.client(parent)
        client.send(parent, {"type": "message.create", "content": 'call research {"topic": "deep"}'})
        events = wait_for(client, parent, lambda e: e["type"] == "turn.completed", timeout=40)
        assert of_type(events, "message.created")[-1]["message"]["content"] == \
            'Done. research: Done. dig: dug {"depth":1}'
        home = deploy.shards().index_of_session(parent)
        for child in (f"{parent}:sub-1", f"{parent}:sub-1:sub-1"):
            assert deploy.keys_named(home, child), child
            assert not deploy.keys_named(1 - home, child), child


def lease_holders(d: Deployment, shard: int) -> dict[bytes, str]:
    """Each leased partition's key on `shard` and its holder (the consumer id of the token)."""
    r = redis.Redis.from_url(d.urls[shard])
    return {k: raw.decode().split(":")[0] for k in r.scan_iter(match="parley:lease:*") if (raw := r.get(k))}


@pytest.mark.parametrize("deploy", [2], indirect=True)
def test_a_standby_of_a_shard_takes_over_a_dispatcher_killed_with_9(deploy: Deployment) -> None:
    active = deploy.start("dispatcher", "tests.apps.scenarios", "--shard", "0", "--lease-ms", "2000")
    deploy.start("dispatcher", "tests.apps.scenarios", "--shard", "1", "--lease-ms", "2000")
    deploy.start("worker", "tests.apps.scenarios")
    wait_ready(deploy)
    sessions = sessions_on_every_shard(deploy, 2, "k-")
    for s in sessions:
        deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
    for s in sessions:
        wait_for(deploy.client(s), s, lambda e: e["type"] == "interrupt.raised", timeout=30)
    mine = f"{socket.gethostname()}-{active.pid}-"
    # the first holds all of shard 0
    assert all(h.startswith(mine) for h in lease_holders(deploy, 0).values())
    standby = deploy.start("dispatcher", "tests.apps.scenarios", "--shard", "0", "--lease-ms", "2000")
    zero = redis.Redis.from_url(deploy.urls[0])
    deadline = time.monotonic() + 30
    while zero.zcard(KEYS.dispatchers) < 2:  # the standby is live, then the first one dies
        assert time.monotonic() < deadline, deploy.logs()
        time.sleep(0.1)
    active.kill()  # kill -9: its leases lapse, the standby takes them
    active.wait()
    deploy.killed = [active]  # type: ignore[attr-defined]
    for s in sessions:
        approve_and_finish(deploy, s)
    # The sessions' partitions are the standby's by now; the rest follow once the dead one
    # leaves the live set (its share counted it until then), so poll for the whole shard.
    served = len(placement_of(deploy).partitions_of(0))
    theirs = f"{socket.gethostname()}-{standby.pid}-"
    deadline = time.monotonic() + 30
    while not (len(held := lease_holders(deploy, 0)) == served
               and all(h.startswith(theirs) for h in held.values())):
        assert time.monotonic() < deadline, (held, deploy.logs())
        time.sleep(0.2)


@pytest.mark.parametrize("deploy", [2], indirect=True)
def test_one_shards_redis_restarts_while_the_other_shard_serves(deploy: Deployment) -> None:
    deploy.start("dispatcher", "tests.apps.scenarios")
    deploy.start("worker", "tests.apps.scenarios")
    wait_ready(deploy)
    sessions = sessions_on_every_shard(deploy, 2, "r-")
    on_zero, on_one = sessions[:2], sessions[2:]
    for s in on_one:
        deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
        wait_for(deploy.client(s), s, lambda e: e["type"] == "interrupt.raised", timeout=30)
    down = deploy.servers[1]
    down.stop()  # AOF on: it comes back with its sessions
    for s in on_zero:  # shard 0 goes on meanwhile: its sessions start and finish
        deploy.client(s).send(s, {"type": "message.create", "content": "email bob: hi"})
        approve_and_finish(deploy, s)
    down.start()
    deploy._shards = None  # new connections to shard 1
    for s in on_one:
        approve_and_finish(deploy, s)
