"""Chaos: drive many sessions through the seed scenario while killing processes and Redis.

    python -m tests.chaos.run_chaos --sessions 200      (make chaos)
    python -m tests.chaos.run_chaos --sessions 40       (make chaos-smoke, in CI)

All as deployed (tests/deployed.py): Redis with the shipped redis.conf (AOF, `appendfsync
always`) and users.acl; dispatchers under `parley-dispatcher`, workers under `parley-worker`;
this driver sends through `parley-producer` as producer `app` (the submit function) and reads
and checks under `parley-reader`; the harness admin only seeds and checks the bookkeeping.
Two dispatchers over two partitions and three workers run tests/apps/chaos_tools.py (the
seed app plus two tools with real bodies); every few seconds one of them is killed with
SIGKILL and replaced; once, Redis itself is killed -9 and restarted from its AOF: every
session's committed transitions (`ver`) are read just before the kill and after the replay,
and none may have gone back. Each seed session parks on the interrupt, is resumed by this
driver, and must finish. Then every session is checked: its input taken (no lost input), no
duplicate message, exactly one delivered resume, nothing still parked, and the transcript
complete.

The evidence is kept outside the Redis under test (tests/chaos/evidence.py): the tool bodies
and this driver append what they did and saw to fsynced files of their own, and each
session's events in Redis at the end must hold every input the driver saw acknowledged and
every event it read. Any `CRITICAL` line in Redis's log and any entry of its ACL LOG (a login
short of a right) are violations as well.

Tool sessions (`--tool-sessions`) ask for two calls at once: `record_once` (not idempotent)
and `record_idem` (idempotent), whose bodies record each execution in their files. What
docs/guarantees.md promises is checked against those records: each call settled exactly once
(one `tool.completed`, one tool message); `record_once` ran at most once, and its result is
either its own (it ran) or `worker_lost`; `record_idem` ran at most 3 times (its attempts), and
a result of its own means it ran. Prints the counts and exits 1 on any violation.

Closes (`--close-fraction`): a random share of the sessions of both kinds is closed by a
client's `session.close` at a random moment after its message (before its model call, while
it is parked, while a tool runs, after it finished), kills and the Redis restart going on
meanwhile. A closed session counts as finished once its `session.closed` is seen, and is
checked for what closing promises: closed once, no work applied after its `session.closed`
(no message, model call, tool call or result, decision, interrupt or turn end: `APPLIED`),
nothing left open (no interrupt, no pending call), and still each call settled at most once
(a result either applied or recorded late) and each tool body run no more than allowed.
"""

import argparse
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis

from parley.client import Client
from parley.runtime.procs import RedisServer, start_parley, stop_processes
from parley.schemas.keys import Keys
from tests.chaos.evidence import DRIVER_FILE, SEEN, AppendOnly, Evidence, delivery_problems
from tests.deployed import (
    DISPATCHER,
    PRODUCER,
    PRODUCER_NAME,
    READER,
    WORKER,
    deployed_redis,
    login,
    ready_for_producers,
)

APP = "tests.apps.chaos_tools"
FINAL = "Done. send_email: sent"
TOOLS = ("record_once", "record_idem")
ATTEMPTS = {"record_once": 1, "record_idem": 3}  # executions allowed per call
#: events that show work applied to a session: none may follow its `session.closed`
#: (`tool.late`, `input.refused` and `input.ignored` may: they apply nothing)
APPLIED = frozenset({
    "session.created", "message.created", "branch.switched", "llm.started", "llm.completed",
    "llm.failed", "llm.voided", "tool.started", "tool.deferred", "tool.completed", "turn.completed",
    "interrupt.raised", "interrupt.resumed", "interrupt.cancelled", "decision.held",
    "decision.released", "decision.failed"})
#: seconds after its message within which a session picked for closing is closed
CLOSE_WITHIN_S = 4.0


def is_tool_session(session: str) -> bool:
    return session.startswith("tools-")


def first_message(session: str) -> str:
    if is_tool_session(session):
        return "\n".join(f"call {tool} {orjson.dumps({'key': session}).decode()}" for tool in TOOLS)
    return f"Email bob@example.com: note {session}"


class Fleet:
    """Processes named `<kind>-<letter>`, each under its kind's login: `urls` maps "dispatcher"
    and "worker" to their Redis URLs (the shipped parley-dispatcher and parley-worker logins)."""

    def __init__(self, urls: dict[str, str], logdir: Path, records: Path):
        self.env = {"PARLEY_APP": APP, "PARLEY_LOG_LEVEL": "WARNING", "CHAOS_RECORDS_DIR": str(records)}
        self.urls = urls
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kills = 0
        self.n = 0

    def start(self, name: str) -> None:
        kind = name.split("-")[0]
        args = (["dispatcher", "--partitions", "2", "--lease-ms", "2000"] if kind == "dispatcher"
                else ["worker"])
        self.n += 1
        self.procs[name] = start_parley(args, {**self.env, "PARLEY_REDIS_URL": self.urls[kind]},
                                        self.logdir / f"{name}-{self.n}.log")

    def kill_one(self, rng: random.Random) -> str:
        name = rng.choice(sorted(self.procs))
        self.procs[name].kill()
        self.procs[name].wait()
        self.kills += 1
        self.start(name)
        return name

    def stop(self) -> list[int]:
        return stop_processes(list(self.procs.values()))


def retrying(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Redis is restarted once during the run: producers retry like a real client would."""
    for _ in range(200):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
            time.sleep(0.1)
    raise RuntimeError("redis stayed unavailable")


def drive(client: Client, sessions: list[str], spread_s: float, deadline: float, stop: threading.Event,
          rng: random.Random, closing: frozenset[str] = frozenset(),
          route: Callable[[str], Client] | None = None, journal: AppendOnly | None = None) -> dict[str, str]:
    """Start the sessions spread over `spread_s` seconds (so kills land at every stage), resume
    each interrupt a random moment after it is raised, close each session of `closing` a random
    moment after its message; return each session's state ("done", or "closed" for those).
    `route`: the client of each session (tests/chaos/run_chaos_shards.py: a client of every
    shard, whose placement it keeps fresh); its events are read on the session's shard.
    `journal`: the driver's own file (tests/chaos/evidence.py), outside the Redis under test:
    each input acknowledged, each delivery event read, each session's final state."""
    route = route or (lambda _s: client)

    def note(record: dict[str, Any]) -> None:
        if journal is not None:
            journal.write(record)

    def send(s: str, value: dict[str, Any], key: str) -> None:
        entry = retrying(route(s).send, s, value, key)
        note({"kind": "sent", "session": s, "input": value["type"], "key": key, "entry": entry,
              **({"interrupt_id": value["interrupt_id"]} if "interrupt_id" in value else {})})

    state = {s: "new" for s in sessions}
    cursors = {s: "0-0" for s in sessions}
    t0 = time.monotonic()
    starts = {s: t0 + spread_s * i / max(1, len(sessions)) for i, s in enumerate(sessions)}
    resume_at: dict[str, tuple[float, str]] = {}
    close_at: dict[str, float] = {}

    def finished(s: str) -> bool:
        return state[s] == ("closed" if s in closing else "done")

    while time.monotonic() < deadline and not all(finished(s) for s in sessions):
        now = time.monotonic()
        for s in sessions:
            if state[s] == "new" and now >= starts[s]:
                send(s, {"type": "message.create", "content": first_message(s)}, f"msg-{s}")
                state[s] = "sent"
                if s in closing:
                    close_at[s] = now + rng.uniform(0, CLOSE_WITHIN_S)
            if s in close_at and now >= close_at[s]:
                # after its message in the same stream: the session exists when it is applied
                send(s, {"type": "session.close", "reason": "chaos"}, f"close-{s}")
                del close_at[s]
            if s in resume_at and state[s] == "parked" and now >= resume_at[s][0]:
                # a resume after the close is ignored (`session_closed`): sent all the same
                send(s, {"type": "interrupt.resume", "interrupt_id": resume_at[s][1],
                         "payload": {"approved": True}}, f"resume-{s}")
                state[s] = "resumed"
            if state[s] == "new" or finished(s):
                continue
            try:
                # the session's shard as its client last read the placement (it follows moves)
                reply: Any = route(s).shards.for_session(s).xread({client.keys.events(s): cursors[s]},
                                                                  count=100)
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                time.sleep(0.1)
                continue
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    cursors[s] = entry_id.decode()
                    event = orjson.loads(fields[b"event"])
                    if event["type"] in SEEN:
                        note({"kind": "seen", "session": s, "type": event["type"], "id": cursors[s]})
                    if event["type"] == "session.closed":
                        state[s] = "closed"
                    elif event["type"] == "interrupt.raised" and state[s] == "sent":
                        resume_at[s] = (time.monotonic() + rng.uniform(0, 3), event["interrupt_id"])
                        state[s] = "parked"
                    elif event["type"] == "turn.completed" and (
                            state[s] == "resumed" or (state[s] == "sent" and is_tool_session(s))):
                        state[s] = "done"
        time.sleep(0.05)
    stop.set()
    for s in sessions:
        note({"kind": "final", "session": s, "state": state[s]})
    return state


def check(client: Client, session: str, tally: dict[str, int], evidence: Evidence,
          same_ids: bool = True) -> list[str]:
    """`evidence`: what the tool bodies and the driver recorded outside Redis (their files);
    `same_ids`: the events the driver read must be there by id (delivery_problems)."""
    pairs = list(client.events(session, block_ms=1, until=time.monotonic() + 0.2))
    events = [e for _id, e in pairs]
    problems = delivery_problems(evidence, session, pairs, same_ids)
    created = [e["message"]["id"] for e in events if e["type"] == "message.created"]
    if len(created) != len(set(created)):
        problems.append(f"duplicate message ids {created}")
    view = client.show(session)
    if view is None:
        return [*problems, "lost input: no session"]
    users = [m for m in view["messages"] if m["role"] == "user"]
    if len(users) != 1:
        problems.append(f"lost or duplicated input: {len(users)} user messages")
    if is_tool_session(session):
        return problems + check_tools(client, session, events, view, tally, evidence)
    delivered = [e for e in events if e["type"] == "interrupt.resumed" and e["delivered"]]
    if len(delivered) != 1:
        problems.append(f"{len(delivered)} delivered resumes")
    if view["parked"] or view["interrupts"]:
        problems.append("still parked")
    contents = [m["content"] for m in view["messages"]]
    if len(view["messages"]) != 4 or contents[-1] != FINAL or contents[2] != "sent":
        problems.append(f"incomplete transcript {contents}")
    return problems


def check_closed(client: Client, session: str, tally: dict[str, int], evidence: Evidence,
                 same_ids: bool = True) -> list[str]:
    """A session closed during the run: closed once, nothing applied after, nothing left open;
    its tool calls (a tool session's) settled at most once, each body run as often as allowed;
    what the driver saw acknowledged and read still in Redis."""
    pairs = list(client.events(session, block_ms=1, until=time.monotonic() + 0.2))
    events = [e for _id, e in pairs]
    view = client.show(session)
    if view is None:
        return ["lost input: no session"]
    tally["closed"] += 1
    tally["tool.late"] += sum(e["type"] == "tool.late" for e in events)
    problems = delivery_problems(evidence, session, pairs, same_ids) + closed_problems(events, view)
    if is_tool_session(session):
        problems += ran_too_often(evidence, session)
    return problems


def closed_problems(events: list[dict[str, Any]], view: dict[str, Any]) -> list[str]:
    """What closing promises, read from a closed session's events and view."""
    problems = []
    closes = [i for i, e in enumerate(events) if e["type"] == "session.closed"]
    if len(closes) != 1:
        return [f"closed {len(closes)} times"]
    applied = [e["type"] for e in events[closes[0] + 1:] if e["type"] in APPLIED]
    if applied:
        problems.append(f"work applied after session.closed: {applied}")
    created = [e["message"]["id"] for e in events if e["type"] == "message.created"]
    if len(created) != len(set(created)):
        problems.append(f"duplicate message ids {created}")
    if len([m for m in view["messages"] if m["role"] == "user"]) != 1:
        problems.append("lost or duplicated input")
    if view["interrupts"] or view["pending"]:
        problems.append(f"left open: interrupts {view['interrupts']}, pending {view['pending']}")
    for tool in TOOLS:
        settled = [e for e in events if e["type"] in ("tool.completed", "tool.late") and e["name"] == tool]
        if len(settled) > 1:
            problems.append(f"{tool}: settled {len(settled)} times ({[e['type'] for e in settled]})")
    return problems


def ran_too_often(evidence: Evidence, session: str) -> list[str]:
    problems = []
    for tool in TOOLS:
        ran = evidence.ran(tool, session)
        if ran > ATTEMPTS[tool]:
            problems.append(f"{tool}: its body ran {ran} times (at most {ATTEMPTS[tool]})")
    return problems


def check_tools(client: Client, session: str, events: list[dict[str, Any]], view: dict[str, Any],
                tally: dict[str, int], evidence: Evidence) -> list[str]:
    """Each call settled once, and each tool body run as often as its idempotency allows."""
    problems = []
    tools = [m for m in view["messages"] if m["role"] == "tool"]
    if len(tools) != len(TOOLS):
        problems.append(f"{len(tools)} tool messages for {len(TOOLS)} calls (a result recorded twice?)")
    if view["messages"][-1]["role"] != "assistant" or not view["messages"][-1]["content"].startswith("Done."):
        problems.append(f"incomplete transcript {[m['content'] for m in view['messages']]}")
    for tool in TOOLS:
        settled = [e for e in events if e["type"] == "tool.completed" and e["name"] == tool]
        ran = evidence.ran(tool, session)
        tally[f"{tool} executions"] += ran
        if len(settled) != 1:
            problems.append(f"{tool}: settled {len(settled)} times")
            continue
        error = settled[0].get("error")
        tally[f"{tool} {error or 'ok'}"] += 1
        if ran > ATTEMPTS[tool]:
            problems.append(f"{tool}: its body ran {ran} times (at most {ATTEMPTS[tool]})")
        if error is None and ran == 0:
            problems.append(f"{tool}: a result of its own, but its body never ran")
        if error not in (None, "worker_lost"):
            problems.append(f"{tool}: unexpected error {error!r}")
    return problems


def leftovers(client: Client, within_s: float = 30.0) -> list[str]:
    """Fleet-wide bookkeeping a finished run must not leave behind (after kills and a Redis
    restart): in-flight and running records, the queues' in-flight numbers, the interrupt counts.
    A number left by the heartbeat sweep goes at the next unclaimed-work walk: waited for."""
    r, keys = client.redis, client.keys
    deadline = time.monotonic() + within_s
    while True:
        numbered = sum(int(r.zcard(k)) for k in r.scan_iter(f"{keys.prefix}:inflight:*"))
        found = {"in-flight records": int(r.hlen(keys.inflight)),
                 "running records": int(r.hlen(keys.running)),
                 "in-flight numbers": numbered, "parked anchors": int(r.hlen(keys.interrupt_anchors)),
                 "parked gauge": int(r.hget(keys.stats, "parked") or 0)}
        problems = [f"{what}: {n} left" for what, n in found.items() if n]
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.5)


def chaos_arguments(doc: str, sessions: int, spread: float, close_fraction: float) -> argparse.Namespace:
    """The options of a chaos driver (this one and run_chaos_shards.py), with its defaults."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=sessions, help="seed sessions")
    parser.add_argument("--tool-sessions", type=int, default=None,
                        help="sessions running the recording tools (default: half --sessions)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--spread", type=float, default=spread, help="seconds over which sessions start")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--close-fraction", type=float, default=close_fraction,
                        help="share of the sessions (of both kinds) closed at a random moment")
    return parser.parse_args()


def versions(r: redis.Redis, keys: Keys, sessions: list[str]) -> dict[str, int]:
    """Each session's committed transitions: the `ver` its commits bump (0: none yet)."""
    pipe = r.pipeline(transaction=False)
    for s in sessions:
        pipe.hget(keys.meta(s), "ver")
    return {s: int(v or 0) for s, v in zip(sessions, pipe.execute(), strict=True)}


@dataclass
class Restart:
    """A kill -9 of a Redis and its start from the AOF, with what it kept: each session's `ver`
    read just before the kill and again once the replay is done. Sessions go on moving
    meanwhile, so none may have fewer after ("not less than"); and the server's log may hold no
    `== CRITICAL ==` line (a transaction the replay skipped)."""

    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    critical: list[str] = field(default_factory=list)

    def regressions(self) -> dict[str, tuple[int, int]]:
        return {s: (v, self.after.get(s, 0)) for s, v in self.before.items() if self.after.get(s, 0) < v}

    def summary(self) -> str:
        return (f"sessions with transitions {sum(v > 0 for v in self.before.values())}, "
                f"transitions before the kill {sum(self.before.values())}, after the restart "
                f"{sum(self.after.values())}, ver_regressions={len(self.regressions())} "
                f"critical_lines={len(self.critical)}")

    def problems(self) -> list[str]:
        found = [f"{s}: ver {v} before the kill, {a} after the restart"
                 for s, (v, a) in sorted(self.regressions().items())[:10]]
        return found + [f"redis log: {line}" for line in self.critical[:5]]


def restart(server: RedisServer, admin: redis.Redis, keys: Keys, sessions: list[str]) -> Restart:
    """kill -9 `server` (`appendfsync always` keeps every acknowledged write) and start it from
    its AOF, counting each session's transitions either side (`admin`: a login that reads them)."""
    done = Restart(before=retrying(versions, admin, keys, sessions))
    server.stop(kill=True)
    time.sleep(0.5)
    server.start()  # returns once the AOF is loaded
    done.after = retrying(versions, admin, keys, sessions)
    done.critical = server.critical_lines()
    return done


def acl_denials(admin: redis.Redis) -> list[str]:
    """What Redis refused any login during the run (`ACL LOG`): the processes run under the
    shipped logins, and one short of a right may only degrade (RQ swallows some refusals)."""
    return [f"{text(e['username'])}: {text(e['reason'])} {text(e['object'])} (x{e.get('count', 1)})"
            for e in retrying(admin.acl_log)]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main() -> int:
    args = chaos_arguments(__doc__ or "", sessions=200, spread=60.0, close_fraction=0.25)
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="parley-chaos-"))
    records = workdir / "records"
    records.mkdir()
    # as deployed: the shipped redis.conf (AOF, appendfsync always) and users.acl
    server = deployed_redis(workdir / "redis").start()
    admin = redis.Redis.from_url(server.url, socket_timeout=5)  # the harness's: seeding and checks
    ready_for_producers(admin, redis.Redis.from_url(server.url_as(login(DISPATCHER))))
    fleet = Fleet({"dispatcher": server.url_as(login(DISPATCHER)), "worker": server.url_as(login(WORKER))},
                  workdir, records)
    for name in ("dispatcher-a", "dispatcher-b", "worker-a", "worker-b", "worker-c"):
        fleet.start(name)
    # the driver's inputs through the producer login (the submit function, as producer `app`),
    # its reads and checks through the reader login; the admin only for the bookkeeping checks
    producer = Client(redis.Redis.from_url(server.url_as(login(PRODUCER)), socket_timeout=5),
                      producer=PRODUCER_NAME)
    reader = Client(redis.Redis.from_url(server.url_as(login(READER)), socket_timeout=5))
    while reader.redis.hget(reader.keys.config, "partitions") is None:
        time.sleep(0.05)  # producers hash sessions over the N the dispatchers publish
    tool_sessions = args.sessions // 2 if args.tool_sessions is None else args.tool_sessions
    # interleaved, so that kills land on both kinds at every stage
    sessions = [f"chaos-{i}" for i in range(args.sessions)]
    for i in range(tool_sessions):
        sessions.insert(min(len(sessions), 3 * i + 1), f"tools-{i}")
    closing = frozenset(rng.sample(sessions, round(len(sessions) * args.close_fraction)))
    stop = threading.Event()
    restarts: list[Restart] = []

    # Redis is killed once half the sessions have started: many are then mid-turn, parked or
    # done, so the transitions counted either side of the kill span every stage
    restart_after_s = max(6.0, args.spread / 2)

    def chaos() -> None:
        started = time.monotonic()
        while not stop.wait(args.kill_every * rng.uniform(0.5, 1.5)):
            if not restarts and time.monotonic() - started > restart_after_s:
                restarts.append(restart(server, admin, reader.keys, sessions))
            else:
                fleet.kill_one(rng)

    chaos_thread = threading.Thread(target=chaos, daemon=True)
    journal = AppendOnly(records / DRIVER_FILE)
    t0 = time.monotonic()
    chaos_thread.start()
    state = drive(producer, sessions, args.spread, t0 + args.timeout, stop, rng, closing, journal=journal)
    chaos_thread.join()
    journal.close()
    elapsed = time.monotonic() - t0
    evidence = Evidence.load(records)
    violations = {}
    tally: Counter[str] = Counter()
    for s in sessions:
        if s in closing:
            problems = check_closed(reader, s, tally, evidence) if state[s] == "closed" else [
                f"not closed (state {state[s]})"]
        else:
            problems = check(reader, s, tally, evidence) if state[s] == "done" else [
                f"did not finish (state {state[s]})"]
        if problems:
            violations[s] = problems
    if not violations and (left := leftovers(Client(admin))):
        violations["leftovers"] = left
    for r in restarts:
        if r.problems():
            violations["redis restart"] = r.problems()
    critical = server.critical_lines()  # the whole log, the run's end included
    if critical:
        violations["redis log"] = critical[:5]
    if evidence.torn:
        violations["records"] = [f"{evidence.torn} lines cut short in {records}"]
    denials = acl_denials(admin)
    if denials:  # RQ swallows some refusals: a login short of a right would go unseen
        violations["acl log"] = denials[:5]
    for s in sorted(violations)[:3]:  # what a stuck session looks like, before Redis goes away
        if s not in state:
            continue
        events = [e["type"] for _id, e in reader.events(s, block_ms=1, until=time.monotonic() + 0.2)]
        (workdir / f"{s}.txt").write_text(f"events: {events}\nview: {reader.show(s)}\n"
                                          f"running: {admin.hgetall(reader.keys.running)}\n")
    crashed = [name for name, proc in fleet.procs.items() if proc.poll() is not None]
    codes = fleet.stop()
    server.stop()
    if crashed or any(codes):
        # a process that died by itself (not one we killed) or did not stop cleanly on SIGTERM
        violations["fleet"] = [f"died on their own: {crashed}", f"exit codes on SIGTERM: {codes}"]
    print(f"chaos: sessions={len(sessions)} (tool sessions {tool_sessions}, closed {len(closing)}) "
          f"finished={sum(v in ('done', 'closed') for v in state.values())} "
          f"kills={fleet.kills} redis_restarts={len(restarts)} violations={len(violations)} "
          f"critical_lines={len(critical)} acl_denials={len(denials)} seconds={elapsed:.1f} "
          f"exit_codes={codes}")
    for r in restarts:
        print(f"redis restart: {r.summary()}")
    print(f"evidence: {evidence.files} files in {records}, {sum(evidence.runs.values())} tool runs, "
          f"{sum(map(len, evidence.sent.values()))} inputs acknowledged, "
          f"{sum(map(len, evidence.seen.values()))} events read")
    print("tools: " + ", ".join(f"{k}={v}" for k, v in sorted(tally.items())))
    for s, problems in sorted(violations.items())[:20]:
        print(f"  {s}: {'; '.join(problems)}")
    if violations:
        print(f"logs in {workdir}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
