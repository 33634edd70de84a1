"""The pure side of a session's end of life (dispatcher/core/retention.py): a close retires the
session (archive and expiry, one effect); with an idle timeout every transition moves the
session's idle time, never while an interrupt with a deadline is open; the idle sweep's close
holds only if the session is still idle when it is applied."""

from typing import Any

from parley.dispatcher.core import AppInfo, Idle, Lifecycle, Listing, Report, Retire, ToolInfo
from parley.dispatcher.core.retention import is_idle
from parley.schemas.codes import SessionStatus

from .harness import Sim, make_app
from .test_subagents import AGENT, close_entry, running_child, spawn_entry

IDLE_CLOSE: dict[str, Any] = {"type": "session.close", "reason": "idle"}
TIMEOUT_MS = 60_000


def idle_sim(**lifecycle: Any) -> Sim:
    return Sim(make_app(has_decide=False), lifecycle=Lifecycle(idle_timeout_ms=TIMEOUT_MS, **lifecycle))


def of(effects: list[Any], kind: type) -> list[Any]:
    return [fx for fx in effects if isinstance(fx, kind)]


# ---- retire -------------------------------------------------------------------------------------


def test_a_close_stamps_closed_at_and_retires_the_session_for_the_configured_retention():
    sim = running_child()
    sim.lifecycle = Lifecycle(retention_ms=5_000)
    sim.input(close_entry(), engine=True)
    assert sim.core.status == SessionStatus.CLOSED
    assert sim.core.closed_at == sim.now
    [retire] = of(sim.last.effects, Retire)
    assert (retire.closed_at, retire.expires_at) == (sim.now, sim.now + 5_000)
    # the retire comes after everything else the close asked for (cancels, the grandchild's close);
    # only the end of the transition's own listing move follows it
    assert [fx for fx in sim.last.effects if not isinstance(fx, Listing)][-1] == retire


def test_the_default_retention_is_seven_days_and_zero_is_allowed():
    assert Lifecycle().retention_ms == 7 * 24 * 3600 * 1000
    sim = running_child()
    sim.lifecycle = Lifecycle(retention_ms=0)
    sim.input(close_entry(), engine=True)
    [retire] = of(sim.last.effects, Retire)
    assert retire.expires_at == retire.closed_at == sim.now


def test_a_closed_session_is_retired_once_later_inputs_retire_nothing():
    sim = running_child()
    sim.input(close_entry(), engine=True)
    closed_at = sim.core.closed_at
    sim.resume("int-1")
    assert sim.ev("input.ignored")["code"] == "session_closed"
    assert not of(sim.last.effects, Retire) and sim.core.closed_at == closed_at
    sim.input({"type": "branch.switch", "head": "x"})
    assert sim.ev("input.refused")["code"] == "session_closed"
    assert not of(sim.last.effects, Retire) and sim.core.closed_at == closed_at


# ---- idle time ----------------------------------------------------------------------------------


def test_without_an_idle_timeout_nothing_is_tracked():
    sim = Sim(make_app(has_decide=False))
    sim.create()
    sim.send("hi")
    assert sim.core.active_at is None
    assert not of(sim.effects, Idle)


def test_every_transition_of_an_open_session_moves_its_idle_time():
    sim = idle_sim()
    sim.create()
    assert sim.core.active_at == sim.now
    assert of(sim.last.effects, Idle) == [Idle(seq=sim.last.effects[-1].seq, at=sim.now + TIMEOUT_MS)]
    sim.now += 10_000
    sim.send("hi")  # an input: its model call is in flight, which keeps the session awake
    assert sim.core.active_at == sim.now and of(sim.last.effects, Idle)[-1].at is None
    [llm] = sim.running_llm()
    sim.now += 10_000
    sim.finish_llm(llm, content="hello")  # a work outcome
    assert sim.core.active_at == sim.now
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS


def test_an_open_interrupt_with_a_deadline_takes_the_session_out_of_the_idle_set_until_it_ends():
    sim = Sim(make_app(), lifecycle=Lifecycle(idle_timeout_ms=TIMEOUT_MS))
    sim.create()
    sim.decide(expect="session.created")
    _turn, _calls, iid = sim.pause_on_tool("search", timeout_s=5)
    assert of(sim.last.effects, Idle)[-1].at is None
    sim.deadline(iid)  # resumed by its deadline: no timer now, but the decision is in flight
    assert of(sim.last.effects, Idle)[-1].at is None
    sim.decide([{"type": "tool.error", "call_id": "call-1", "error": "declined"}])
    sim.decide([])  # the tool's failure: nothing more to do
    assert sim.core.deciding is None and sim.core.work == {} and not sim.core.queue
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS  # nothing in flight: idle from now


def test_work_in_flight_keeps_a_session_awake_and_its_idle_close_is_ignored():
    """A model call, a decision or a running tool or sub-agent call may take longer than the idle
    timeout with no transition meanwhile: the session is not idle until it has ended."""
    sim = idle_sim()
    sim.create()
    sim.send("hi")
    assert of(sim.last.effects, Idle)[-1].at is None  # its model call is in flight
    sim.now += 10 * TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("input.ignored")["code"] == "not_idle" and sim.core.status == SessionStatus.OPEN
    [llm] = sim.running_llm()
    sim.finish_llm(llm, content="hello")  # the turn is over: nothing in flight
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS
    sim.now += TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("session.closed")["reason"] == "idle"


def test_the_idle_close_of_a_sub_agents_child_fails_its_parents_call_at_once():
    """A child left waiting on a deferred call is idle like any session; its parent's call
    then fails with `subagent_closed` rather than waiting for its time limit."""
    sim = Sim(make_app(has_decide=False, tools={}), session="p:sub-1",
              agents={AGENT: AppInfo(has_decide=False, tools={"ask": ToolInfo(deferred=True)})},
              lifecycle=Lifecycle(idle_timeout_ms=TIMEOUT_MS))
    sim.input(spawn_entry(), engine=True)
    sim.reply_tools("ask")  # deferred: waits on a client, nothing in flight
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS
    sim.now += TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("session.closed")["reason"] == "idle"
    [report] = of(sim.last.effects, Report)
    outcome = report.outcome
    assert (outcome.ok, outcome.error, outcome.work) == (False, "subagent_closed", "call-1")


def test_an_interrupt_without_a_deadline_does_not_stop_the_idle_time():
    sim = Sim(make_app(), lifecycle=Lifecycle(idle_timeout_ms=TIMEOUT_MS))
    sim.create()
    sim.decide(expect="session.created")
    sim.pause_on_tool("search")
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS


def test_a_close_takes_no_idle_time_the_retire_clears_it():
    sim = idle_sim()
    sim.create()
    sim.now += TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert not of(sim.last.effects, Idle) and of(sim.last.effects, Retire)


# ---- the idle sweep's close ---------------------------------------------------------------------


def test_the_idle_close_of_a_session_idle_long_enough_closes_and_retires_it():
    sim = idle_sim(retention_ms=1_000)
    sim.create()
    sim.send("hi")
    [llm] = sim.running_llm()
    sim.finish_llm(llm, content="hello")  # its turn over, nothing in flight
    active = sim.now
    sim.now = active + TIMEOUT_MS - 1  # the close is applied one ms later: exactly due
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.types() == ["session.closed"] and sim.ev("session.closed")["reason"] == "idle"
    assert sim.core.status == SessionStatus.CLOSED and sim.core.closed_at == sim.now
    [retire] = of(sim.last.effects, Retire)
    assert retire.expires_at == sim.now + 1_000


def test_the_idle_close_of_a_session_active_since_is_ignored():
    sim = idle_sim()
    sim.create()
    sim.now += TIMEOUT_MS - 10  # a transition came in the meantime: not idle yet
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("input.ignored")["code"] == "not_idle"
    assert sim.core.status == SessionStatus.OPEN and not of(sim.last.effects, Retire)
    # it stays tracked: the ignored close is a transition like any other
    assert of(sim.last.effects, Idle)[-1].at == sim.now + TIMEOUT_MS


def test_the_idle_close_of_a_session_waiting_on_a_deadline_is_ignored_however_long_it_waited():
    sim = Sim(make_app(), lifecycle=Lifecycle(idle_timeout_ms=TIMEOUT_MS))
    sim.create()
    sim.decide(expect="session.created")
    sim.pause_on_tool("search", timeout_s=3600)
    sim.now += 10 * TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("input.ignored")["code"] == "not_idle" and sim.core.status == SessionStatus.OPEN


def test_the_idle_close_is_ignored_where_no_idle_timeout_is_configured():
    sim = Sim(make_app(has_decide=False))
    sim.create()
    sim.now += 10 * TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("input.ignored")["code"] == "not_idle" and sim.core.status == SessionStatus.OPEN


def test_the_idle_close_of_a_session_that_does_not_exist_is_ignored():
    sim = idle_sim()
    sim.input(IDLE_CLOSE, engine=True)
    assert sim.ev("input.ignored")["code"] == "unknown_session" and sim.state.core is None


def test_is_idle_is_false_for_a_closed_session():
    sim = idle_sim()
    sim.create()
    sim.now += TIMEOUT_MS
    sim.input(IDLE_CLOSE, engine=True)
    ctx = sim.ctx()
    assert not is_idle(sim.core, ctx) and not is_idle(None, ctx)
