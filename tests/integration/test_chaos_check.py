"""The chaos run's tool check (tests/chaos/run_chaos.py) finds what it is there to find.

A chaos run that cannot fail proves nothing: here the check is given sessions as Redis would
hold them after a run, with the tool bodies' execution records, and must name each violation
of docs/guarantees.md (a non-idempotent tool run twice, a result recorded twice, a result
without a run) and accept what the guarantees allow (a lost non-idempotent call, retries of an
idempotent one).
"""

from collections import Counter
from typing import Any

import redis

from parley.client import Client
from tests.apps.chaos_tools import ran_key
from tests.chaos.run_chaos import check_tools, leftovers


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
