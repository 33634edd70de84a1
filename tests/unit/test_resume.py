"""The person's side of an interrupt, on the pure core: what a resume says it resumes, typed
answers (`response_schema`) and the entry every event about an input names (docs/protocol.md)."""

from typing import Any

import pytest

from parley.schemas.codes import RefusalCode

from .harness import Sim

SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}},
          "required": ["approved"], "additionalProperties": False}


# ---- what interrupt.resumed says it resumes --------------------------------------------------


def test_resumed_trigger_and_event_carry_the_interrupts_reason_and_request():
    s = Sim()
    s.pause_on_tool("send_email", payload={"message": "Send?"})
    s.resume("int-1", {"approved": True}, entry_id="7-1")
    trigger = s.trigger
    assert trigger["type"] == "interrupt.resumed"
    assert trigger["reason"] == "confirm" and trigger["request"] == {"message": "Send?"}
    event = s.ev("interrupt.resumed")
    assert event["reason"] == "confirm" and event["request"] == {"message": "Send?"}


def test_a_budget_resume_is_recognisable_by_its_reason():
    s = Sim()
    iid = s.budget_stopped()
    s.resume(iid, {"budget": {"llm_calls": 5}})
    assert s.trigger["reason"] == "budget"
    assert s.trigger["request"]["exceeded"] == "llm_calls"


# ---- typed answers -------------------------------------------------------------------------------


def test_a_resume_that_does_not_match_the_response_schema_is_refused_and_the_interrupt_stays_open():
    s = Sim()
    s.pause_on_tool("send_email", response_schema=SCHEMA)
    assert s.interrupt("int-1").response_schema == SCHEMA
    assert s.index_adds(s.transitions[-1])[0].response_schema == SCHEMA
    s.resume("int-1", {"approved": "yes"}, entry_id="9-1")
    refused = s.ev("input.refused")
    assert refused["code"] == RefusalCode.INVALID_RESUME == "invalid_resume"
    assert refused["path"] == "$.approved" and "'yes' is not of type 'boolean'" in refused["message"]
    assert refused["input"]["entry"] == "9-1"
    assert "int-1" in s.core.interrupts
    s.resume("int-1", {"approved": True})
    assert s.ev("interrupt.resumed")["delivered"] is True and "int-1" not in s.core.interrupts


def test_a_missing_required_field_names_the_object_it_is_missing_from():
    s = Sim()
    s.pause_on_tool("send_email", response_schema=SCHEMA)
    s.resume("int-1", {})
    refused = s.ev("input.refused")
    assert refused["path"] == "$" and "'approved' is a required property" in refused["message"]


def _interrupt_decision(s: Sim, **fields: Any) -> str:
    s.start("please")
    s.reply_tools("send_email")
    s.decide([{"type": "interrupt", "reason": "confirm", **fields}], expect="tool.execute")
    return s.ev("decision.failed")["error"] if s.of("decision.failed") else ""


def test_an_invalid_response_schema_makes_the_decision_invalid():
    s = Sim()
    error = _interrupt_decision(s, response_schema={"type": "no-such-type"})
    assert "response_schema" in error and "is not valid" in error
    assert s.core.interrupts == {}


def test_a_default_that_does_not_match_the_response_schema_makes_the_decision_invalid():
    s = Sim()
    error = _interrupt_decision(s, response_schema=SCHEMA, timeout_s=5, default={"approved": "no"})
    assert "default" in error and "$.approved" in error
    assert s.core.interrupts == {}


def test_a_deadline_resumes_with_a_default_that_matches():
    s = Sim()
    _interrupt_decision(s, response_schema=SCHEMA, timeout_s=5, default={"approved": False})
    s.deadline("int-1")
    assert s.ev("interrupt.resumed")["payload"] == {"approved": False}


def test_a_response_schema_over_the_size_limit_makes_the_decision_invalid():
    s = Sim()
    big = {"type": "object", "description": "x" * 20_000}
    error = _interrupt_decision(s, response_schema=big)
    assert "response_schema" in error and "16384" in error


# ---- the entry an event is about -----------------------------------------------------------------


def test_events_an_input_causes_name_its_entry():
    s = Sim()
    s.create(entry_id="1-1")
    assert s.ev("session.created")["input"] == {"entry": "1-1", "type": "session.create"}
    s.decide(expect="session.created")
    s.send("hi", entry_id="2-1")
    assert s.ev("message.created")["input"]["entry"] == "2-1"
    s.switch("msg-1", entry_id="3-1")
    assert s.ev("branch.switched")["input"] == {"entry": "3-1", "type": "branch.switch", "head": "msg-1"}


def test_the_resumed_event_names_the_resume_entry_but_not_for_a_deadline():
    s = Sim()
    s.pause_on_tool("send_email")
    s.resume("int-1", {"approved": True}, entry_id="5-1")
    assert s.ev("interrupt.resumed")["input"] == {"entry": "5-1", "type": "interrupt.resume",
                                                  "interrupt_id": "int-1"}
    s2 = Sim()
    _interrupt_decision(s2, timeout_s=5)
    s2.deadline("int-1")
    assert "input" not in s2.ev("interrupt.resumed")


@pytest.mark.parametrize("schema", [
    {"$ref": "https://example.invalid/answer.json"},
    {"type": "object", "properties": {"to": {"$dynamicRef": "other.json#node"}}},
], ids=["ref", "dynamic-ref"])
def test_a_reference_outside_the_schema_makes_the_decision_invalid(schema: dict[str, Any]):
    s = Sim()
    error = _interrupt_decision(s, response_schema=schema)
    assert "references must stay inside the schema" in error and s.core.interrupts == {}


def test_unique_items_is_refused_in_a_response_schema():
    """Its check compares every pair of an answer's items: a producer could stall a dispatcher."""
    s = Sim()
    error = _interrupt_decision(s, response_schema={"type": "array", "uniqueItems": True})
    assert "uniqueItems" in error and s.core.interrupts == {}


def test_an_answer_over_the_size_limit_is_refused_and_the_interrupt_stays_open():
    s = Sim()
    s.pause_on_tool("send_email", response_schema={"type": "array"})
    s.resume("int-1", ["x" * 100] * 200)
    refused = s.ev("input.refused")
    assert refused["code"] == "invalid_resume" and "at most 16384 bytes" in refused["message"]
    assert "int-1" in s.core.interrupts
    s.resume("int-1", ["x"] * 10)
    assert "int-1" not in s.core.interrupts


def test_a_reference_inside_the_schema_resolves():
    schema = {"$defs": {"yes_no": {"type": "boolean"}},
              "type": "object", "properties": {"approved": {"$ref": "#/$defs/yes_no"}}}
    s = Sim()
    s.pause_on_tool("send_email", response_schema=schema)
    s.resume("int-1", {"approved": 1})
    assert s.ev("input.refused")["path"] == "$.approved"
    s.resume("int-1", {"approved": False})
    assert s.ev("interrupt.resumed")["delivered"] is True
