"""Events as stored (docs/protocol.md, Events): a null field is left out, but a user's own JSON
value (`payload`, `request`, `result`) is written even when it is null."""

import orjson

from parley.dispatcher.core.transition import Tx
from parley.schemas.events import EVENT_ADAPTER, USER_VALUE_FIELDS, InterruptRaised, SessionCreated
from tests.unit.harness import Sim


def nulls(event: dict) -> set[str]:
    return {k for k, v in event.items() if v is None}


def test_a_session_without_budget_or_metadata_writes_neither():
    s = Sim()
    s.send("hello")
    created = s.ev("session.created", s.last)
    assert "budget" not in created and "metadata" not in created
    # the contract reads them as None all the same
    model = EVENT_ADAPTER.validate_python(created)
    assert isinstance(model, SessionCreated) and model.budget is None and model.metadata is None


def test_a_budget_and_metadata_given_are_written():
    s = Sim()
    tr = s.create(budget={"llm_calls": 2}, metadata={"team": "a"})
    created = s.ev("session.created", tr)
    assert created["budget"] == {"llm_calls": 2} and created["metadata"] == {"team": "a"}


def test_an_interrupt_payload_that_is_null_is_written_as_null():
    s = Sim()
    s.open_session()
    _turn, _calls, iid = s.pause_on_tool("send_email", payload=None)
    raised = s.ev("interrupt.raised")
    assert "payload" in raised and raised["payload"] is None
    assert raised["anchor"] is not None  # anchored: written as before
    s.resume(iid, None)
    resumed = s.ev("interrupt.resumed")
    # the answer and the question, both null: both written; no principal (unsigned): not written
    assert {"payload", "request"} <= resumed.keys()
    assert resumed["payload"] is None and resumed["request"] is None
    assert "principal" not in resumed


def test_emit_leaves_out_every_null_but_the_user_values():
    s = Sim()
    s.send("hello")
    tx = Tx(s.state, s.ctx(), s.session)
    tx.emit("interrupt.raised", interrupt_id="int-9", reason="r", payload=None, anchor=None)
    tx.emit("tool.late", call_id="call-9", name="t", result=None, error=None)
    tx.emit("interrupt.cancelled", interrupt_id="int-9", reason="r", request=None, why="closed")
    raised, late, cancelled = tx.out.events
    assert raised == {"type": "interrupt.raised", "at": s.now, "interrupt_id": "int-9", "reason": "r",
                      "payload": None}
    assert late == {"type": "tool.late", "at": s.now, "call_id": "call-9", "name": "t", "result": None}
    assert nulls(cancelled) == {"request"}
    for event in tx.out.events:
        assert nulls(event) <= USER_VALUE_FIELDS
        EVENT_ADAPTER.validate_python(event)
    # a global interrupt without its anchor is still an interrupt.raised whose anchor is None
    model = EVENT_ADAPTER.validate_python(raised)
    assert isinstance(model, InterruptRaised) and model.anchor is None


def test_a_parked_seed_session_writes_no_null_but_user_values():
    """Every event of a session run to a parked interrupt, as the seed flow does: no null
    outside the user values, and together under the 1 KiB stream node the deployment's
    redis.conf sets (stream-node-max-bytes): one parked session's events in one node."""
    s = Sim()
    s.pause_on_tool("send_email", payload={"message": "Send the email?"})
    assert s.of("interrupt.raised") and s.of("session.created")
    for event in s.events:
        assert nulls(event) <= USER_VALUE_FIELDS, event
    assert sum(len(orjson.dumps(e)) for e in s.events) < 1024
