"""The chaos run's checks (tests/chaos/run_chaos.py) find what they are there to find.

A chaos run that cannot fail proves nothing: here the check is given sessions as Redis would
hold them after a run, with the tool bodies' execution records (files of their own, outside
Redis: tests/chaos/evidence.py, written as tests/apps/chaos_tools.py writes them), and must
name each violation of docs/guarantees.md (a non-idempotent tool run twice, a result recorded
twice, a result without a run) and accept what the guarantees allow (a lost non-idempotent call, retries of an
idempotent one). Likewise for closed sessions: work applied after `session.closed` is named,
a result recorded late is not. And what the driver wrote down must still be in Redis at the
end: an input it saw acknowledged and an event it read, gone, are named; a restart's count of
transitions going back, too.
"""

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from parley.client import Client
from tests.apps import chaos_tools
from tests.chaos.evidence import DRIVER_FILE, AppendOnly, Evidence, delivery_problems
from tests.chaos.run_chaos import Restart, check_closed, check_tools, closed_problems, leftovers
from tests.integration.conftest import MakeDispatcher, tick


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the tool bodies append their runs to (CHAOS_RECORDS_DIR); they do not sleep."""
    monkeypatch.setenv("CHAOS_RECORDS_DIR", str(tmp_path / "records"))
    monkeypatch.setattr(chaos_tools.time, "sleep", lambda _s: None)
    monkeypatch.setattr(chaos_tools, "_records", None)
    (tmp_path / "records").mkdir()
    return tmp_path / "records"


def completed(name: str, error: str | None = None) -> dict[str, Any]:
    return {"type": "tool.completed", "name": name, **({"error": error} if error else {})}


def view(tool_messages: int = 2) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "call ..."}, {"role": "assistant", "content": ""},
                         *[{"role": "tool", "content": "ran"}] * tool_messages,
                         {"role": "assistant", "content": "Done. record_once: ran; record_idem: ran"}]}


def ran(session: str, once: int, idem: int) -> None:
    """The tool bodies run as a worker runs them: each run one line of this process's file."""
    for _ in range(once):
        chaos_tools.record_once(session)
    for _ in range(idem):
        chaos_tools.record_idem(session)


def problems(records: Path, session: str, events: list[dict[str, Any]], tool_messages: int = 2) -> list[str]:
    return check_tools(Client(redis.Redis()), session, events, view(tool_messages), Counter(),
                       Evidence.load(records))


def test_each_run_is_a_line_on_disk_in_a_file_of_its_process(records: Path) -> None:
    ran("tools-x", once=1, idem=2)
    (path,) = records.iterdir()
    assert path.name == f"tools-{os.getpid()}.log" and len(path.read_bytes().splitlines()) == 3
    evidence = Evidence.load(records)
    assert (evidence.ran("record_once", "tools-x"), evidence.ran("record_idem", "tools-x")) == (1, 2)


def test_what_the_guarantees_allow_passes(records: Path) -> None:
    ran("tools-ok", once=1, idem=1)
    assert problems(records, "tools-ok", [completed("record_once"), completed("record_idem")]) == []
    lost = [completed("record_once", "worker_lost"), completed("record_idem")]
    ran("tools-lost", once=1, idem=3)  # killed mid-tool: settled lost; the idempotent one retried
    assert problems(records, "tools-lost", lost) == []
    ran("tools-gap", once=0, idem=1)  # lost between the pop and the record: never ran
    assert problems(records, "tools-gap", lost) == []


def test_each_violation_is_named(records: Path) -> None:
    ran("tools-twice", once=2, idem=4)
    assert problems(records, "tools-twice", [completed("record_once"), completed("record_idem")]) == [
        "record_once: its body ran 2 times (at most 1)", "record_idem: its body ran 4 times (at most 3)"]
    ran("tools-dup", once=1, idem=1)
    assert problems(records, "tools-dup", [completed("record_once"), completed("record_once"),
                                           completed("record_idem")], tool_messages=3) == [
        "3 tool messages for 2 calls (a result recorded twice?)", "record_once: settled 2 times"]
    ran("tools-none", once=0, idem=0)
    none = [completed("record_once"), completed("record_idem", "timeout")]
    assert problems(records, "tools-none", none) == [
        "record_once: a result of its own, but its body never ran", "record_idem: unexpected error 'timeout'"]


def test_the_runs_of_several_processes_add_up_and_a_torn_line_is_counted(records: Path) -> None:
    for pid, token in ((101, "a"), (102, "b"), (102, "b")):  # a line written twice: one run
        AppendOnly(records / f"tools-{pid}.log").write(
            {"tool": "record_once", "key": "tools-p", "token": token, "pid": pid})
    with open(records / "tools-103.log", "ab") as f:
        f.write(b'{"tool": "record_on')  # killed mid-write
    evidence = Evidence.load(records)
    assert evidence.ran("record_once", "tools-p") == 2 and evidence.torn == 1 and evidence.files == 3


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
        r: redis.Redis, make_dispatcher: MakeDispatcher, records: Path) -> None:
    client = Client(r)
    d = make_dispatcher()
    client.send("tools-c", {"type": "message.create", "content": "hi"})
    client.close("tools-c", "chaos")
    tick(d)
    tally: Counter[str] = Counter()
    assert check_closed(client, "tools-c", tally, Evidence.load(records)) == [] and tally["closed"] == 1
    ran("tools-c", once=2, idem=1)
    assert check_closed(client, "tools-c", tally, Evidence.load(records)) == [
        "record_once: its body ran 2 times (at most 1)"]


# ---- the driver's own record -------------------------------------------------------------------


def journal(records: Path, *lines: dict[str, Any]) -> Evidence:
    driver = AppendOnly(records / DRIVER_FILE)
    for line in lines:
        driver.write(line)
    driver.close()
    return Evidence.load(records)


def sent(kind: str, entry: str, **more: str) -> dict[str, Any]:
    return {"kind": "sent", "session": "s-1", "input": kind, "key": f"{kind}-s-1", "entry": entry, **more}


def seen(kind: str, event_id: str) -> dict[str, Any]:
    return {"kind": "seen", "session": "s-1", "type": kind, "id": event_id}


USER = ("1-0", message("msg-1", "user"))
RAISED = ("2-0", {"type": "interrupt.raised", "interrupt_id": "int-1"})
RESUMED = ("3-0", {"type": "interrupt.resumed", "interrupt_id": "int-1", "delivered": True})
DONE = ("4-0", {"type": "turn.completed"})


def test_what_the_driver_saw_and_redis_still_holds_passes(records: Path) -> None:
    evidence = journal(records, sent("message.create", "9-0"), seen("interrupt.raised", "2-0"),
                       sent("interrupt.resume", "9-1", interrupt_id="int-1"),
                       seen("interrupt.resumed", "3-0"), seen("turn.completed", "4-0"))
    assert delivery_problems(evidence, "s-1", [USER, RAISED, RESUMED, DONE]) == []
    # after a failover the events may be written again, with new ids: by type then
    again = [USER, ("7-0", RAISED[1]), ("8-0", RESUMED[1]), ("9-0", DONE[1])]
    assert delivery_problems(evidence, "s-1", again, same_ids=False) == []
    assert delivery_problems(evidence, "s-1", again) == [
        "events the driver read are gone from Redis: "
        "['interrupt.raised 2-0', 'interrupt.resumed 3-0', 'turn.completed 4-0']"]


def test_an_acknowledged_input_or_a_read_event_redis_lost_is_named(records: Path) -> None:
    evidence = journal(records, sent("message.create", "9-0"), seen("interrupt.raised", "2-0"),
                       sent("interrupt.resume", "9-1", interrupt_id="int-1"), seen("turn.completed", "4-0"),
                       sent("session.close", "9-2"))
    assert delivery_problems(evidence, "s-1", [RAISED]) == [
        "its message (entry 9-0) acknowledged, never applied",
        "its resume of int-1 (entry 9-1) acknowledged, never delivered",
        "its close (entry 9-2) acknowledged, never applied",
        "events the driver read are gone from Redis: ['turn.completed 4-0']"]
    assert delivery_problems(evidence, "s-1", [RAISED], same_ids=False)[-1] == (
        "events the driver read are gone from Redis: ['turn.completed']")
    # a resume that met the session closed is not delivered, and need not be
    closed = [USER, RAISED, ("5-0", CLOSED), DONE]
    assert delivery_problems(evidence, "s-1", closed) == []


def test_a_restart_that_loses_transitions_is_named() -> None:
    kept = Restart(before={"s-1": 3, "s-2": 0}, after={"s-1": 5, "s-2": 1})
    assert kept.problems() == [] and "ver_regressions=0 critical_lines=0" in kept.summary()
    lost = Restart(before={"s-1": 3, "s-2": 4}, after={"s-1": 3, "s-2": 2},
                   critical=["# == CRITICAL == This server is sending an error to its AOF-loading-client"])
    assert lost.problems() == ["s-2: ver 4 before the kill, 2 after the restart",
                               "redis log: # == CRITICAL == This server is sending an error to its "
                               "AOF-loading-client"]
    assert "ver_regressions=1 critical_lines=1" in lost.summary()
