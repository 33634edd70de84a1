"""The chaos run's checks (tests/chaos/run_chaos.py) find what they are there to find.

A chaos run that cannot fail proves nothing: here the check is given sessions as Redis would
hold them after a run, with the tool bodies' execution records, and must name each violation
of docs/guarantees.md (a non-idempotent tool run twice, a result recorded twice, a result
without a run) and accept what the guarantees allow (a lost non-idempotent call, retries of an
idempotent one). Likewise for closed sessions: work applied after `session.closed` is named,
a result recorded late is not.
"""

from collections import Counter
from typing import Any

import redis

from parley.client import Client
from tests.apps.chaos_tools import ran_key
from tests.chaos.run_chaos import check_closed, check_tools, closed_problems, leftovers
from tests.integration.conftest import MakeDispatcher, tick


def completed(name: str, error: str | None = None) -> dict[str, Any]:
    return {"type": "tool.completed", "name": name, **({"error": error} if error else {})}


def view(tool_messages: int = 2) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "call ..."}, {"role": "assistant", "content": ""},
                         *[{"role": "tool", "content": "ran"}] * tool_messages,
                         {"role": "assistant", "content": "Done. record_once: ran; record_idem: ran"}]}


def ran(r: redis.Redis, session: str, once: int, idem: int) -> None:
    for tool, n in (("record_once", once), ("record_idem", idem)):
        for i in range(n):
            r.sadd(ran_key(tool, session), f"run-{i}")


def problems(r: redis.Redis, session: str, events: list[dict[str, Any]], tool_messages: int = 2) -> list[str]:
    return check_tools(Client(r), session, events, view(tool_messages), Counter())


def test_what_the_guarantees_allow_passes(r: redis.Redis) -> None:
    ran(r, "tools-ok", once=1, idem=1)
    assert problems(r, "tools-ok", [completed("record_once"), completed("record_idem")]) == []
    lost = [completed("record_once", "worker_lost"), completed("record_idem")]
    ran(r, "tools-lost", once=1, idem=3)  # killed mid-tool: settled lost; the idempotent one retried
    assert problems(r, "tools-lost", lost) == []
    ran(r, "tools-gap", once=0, idem=1)  # lost between the pop and the record: never ran
    assert problems(r, "tools-gap", lost) == []


def test_each_violation_is_named(r: redis.Redis) -> None:
    ran(r, "tools-twice", once=2, idem=4)
    assert problems(r, "tools-twice", [completed("record_once"), completed("record_idem")]) == [
        "record_once: its body ran 2 times (at most 1)", "record_idem: its body ran 4 times (at most 3)"]
    ran(r, "tools-dup", once=1, idem=1)
    assert problems(r, "tools-dup", [completed("record_once"), completed("record_once"),
                                     completed("record_idem")], tool_messages=3) == [
        "3 tool messages for 2 calls (a result recorded twice?)", "record_once: settled 2 times"]
    ran(r, "tools-none", once=0, idem=0)
    assert problems(r, "tools-none", [completed("record_once"), completed("record_idem", "timeout")]) == [
        "record_once: a result of its own, but its body never ran", "record_idem: unexpected error 'timeout'"]


def test_the_run_names_fleet_wide_bookkeeping_left_behind(r: redis.Redis) -> None:
    client = Client(r)
    assert leftovers(client, within_s=0) == []
    r.hset("parley:inflight", "job-1", "{}")
    r.zadd("parley:inflight:llm", {"job-1": 1})
    r.hset("parley:interrupts:anchors", "s-1\x1fmsg-2", 1)
    r.hset("parley:stats", "parked", 1)
    assert leftovers(client, within_s=0) == ["in-flight records: 1 left", "in-flight numbers: 1 left",
                                             "parked anchors: 1 left", "parked gauge: 1 left"]


# ---- closed sessions ---------------------------------------------------------------------------


def message(mid: str, role: str) -> dict[str, Any]:
    return {"type": "message.created", "message": {"id": mid, "role": role}}


CLOSED = {"type": "session.closed", "reason": "chaos"}
OPEN_VIEW: dict[str, Any] = {"messages": [{"role": "user"}, {"role": "assistant"}], "interrupts": [],
                             "pending": []}


def test_a_closed_session_with_nothing_applied_after_its_close_passes() -> None:
    events = [message("msg-1", "user"), {"type": "llm.started"},
              {"type": "tool.started", "name": "record_once"}, {"type": "interrupt.cancelled"}, CLOSED,
              {"type": "tool.late", "name": "record_once"},
              {"type": "input.ignored", "code": "session_closed"}, {"type": "input.refused"}]
    assert closed_problems(events, OPEN_VIEW) == []


def test_work_applied_after_the_close_is_a_violation() -> None:
    after = [message("msg-2", "assistant"), completed("record_idem"), {"type": "turn.completed"}]
    assert closed_problems([message("msg-1", "user"), CLOSED, *after], OPEN_VIEW) == [
        "work applied after session.closed: ['message.created', 'tool.completed', 'turn.completed']"]
    assert closed_problems([message("msg-1", "user"), CLOSED, {"type": "interrupt.raised"}], OPEN_VIEW) == [
        "work applied after session.closed: ['interrupt.raised']"]


def test_a_call_both_applied_and_late_or_things_left_open_or_two_closes_are_violations() -> None:
    twice = [message("msg-1", "user"), completed("record_once"), CLOSED,
             {"type": "tool.late", "name": "record_once"}]
    left = {**OPEN_VIEW, "pending": [{"call_id": "call-1"}]}
    assert closed_problems(twice, left) == [
        "left open: interrupts [], pending [{'call_id': 'call-1'}]",
        "record_once: settled 2 times (['tool.completed', 'tool.late'])"]
    assert closed_problems([message("msg-1", "user"), CLOSED, CLOSED], OPEN_VIEW) == ["closed 2 times"]
    assert closed_problems([message("msg-1", "user")], OPEN_VIEW) == ["closed 0 times"]


def test_a_closed_session_is_read_from_redis_and_its_tool_bodies_counted(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    client = Client(r)
    d = make_dispatcher()
    client.send("tools-c", {"type": "message.create", "content": "hi"})
    client.close("tools-c", "chaos")
    tick(d)
    tally: Counter[str] = Counter()
    assert check_closed(client, "tools-c", tally) == [] and tally["closed"] == 1
    ran(r, "tools-c", once=2, idem=1)
    assert check_closed(client, "tools-c", tally) == ["record_once: its body ran 2 times (at most 1)"]
