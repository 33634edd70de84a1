"""The clients' pure parts (parley/producer.py): what both `Client` and `AsyncClient` do
between Redis calls, so the two are thin I/O shells over one logic."""

import orjson
import pytest

from parley.producer import (
    InvalidInput,
    OutcomeWait,
    input_fields,
    resume_input,
    typed_events,
    xread_events,
)
from parley.schemas.events import InterruptRaised
from parley.schemas.inputs import MessageCreate, SessionCreate
from parley.schemas.resumes import RESUME, ResumeStatus


def test_a_typed_input_model_is_sent_as_its_json_keeping_an_omitted_parent_omitted() -> None:
    fields = input_fields("s1", MessageCreate(type="message.create", content="hi"))
    assert orjson.loads(fields["input"]) == {"type": "message.create", "content": "hi"}
    rooted = input_fields("s1", MessageCreate(type="message.create", content="hi", parent_id=None))
    assert orjson.loads(rooted["input"]) == {"type": "message.create", "content": "hi", "parent_id": None}


def test_a_dict_input_is_sent_as_given() -> None:
    fields = input_fields("s1", {"type": "session.create", "budget": {"llm_calls": 2}}, "k1")
    assert fields["session"] == "s1" and fields["id"] == "k1"
    assert orjson.loads(fields["input"]) == {"type": "session.create", "budget": {"llm_calls": 2}}
    assert SessionCreate.model_validate_json(fields["input"]).budget is not None


@pytest.mark.parametrize(("session", "value", "says"), [
    ("s1", {"type": "message.create"}, "content: Field required"),
    ("s1", {"type": "nope"}, "unknown input type 'nope'"),
    ("s1", {"type": "message.create", "content": 3}, "content: Input should be a valid string"),
    ("bad session!", {"type": "message.create", "content": "x"}, "`session` must be"),
    ("s1", {"type": "message.create", "content": "x", "message_id": 2**70}, "64-bit"),
    ("s1", {"type": "message.create", "content": {1, 2}}, "not JSON"),
])
def test_an_invalid_input_is_refused_with_the_dispatchers_message(
        session: str, value: dict, says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        input_fields(session, value)
    assert says in str(err.value)


def test_a_signed_input_gets_an_id_and_is_valid() -> None:
    fields = input_fields("s1", {"type": "message.create", "content": "x"}, principal="ada", key="k")
    assert fields["principal"] == "ada" and fields["id"] and fields["sig"]


def test_resume_input_is_the_typed_interrupt_resume() -> None:
    assert resume_input("int-1", {"ok": True}).model_dump() == {
        "type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"ok": True}}
    with pytest.raises(InvalidInput, match="interrupt_id"):
        resume_input("no spaces", None)


def _reply(*events: tuple[bytes, dict]) -> list:
    return [[b"parley:{s}:events", [(eid, {b"event": orjson.dumps(e)}) for eid, e in events]]]


RAISED = {"type": "interrupt.raised", "at": 1, "interrupt_id": "int-1", "reason": "approval",
          "payload": {"q": 1}, "anchor": None}


def test_an_xread_reply_reads_as_ids_and_events_bytes_or_text() -> None:
    assert list(xread_events(_reply((b"1-0", RAISED)))) == [("1-0", RAISED)]
    as_text = [["k", [("2-0", {"event": orjson.dumps(RAISED).decode()})]]]
    assert list(xread_events(as_text)) == [("2-0", RAISED)]
    assert list(xread_events(None)) == []


def test_typed_events_validates_each_event() -> None:
    [(eid, event)] = typed_events(xread_events(_reply((b"1-0", RAISED))))
    assert eid == "1-0" and isinstance(event, InterruptRaised) and event.payload == {"q": 1}


def test_an_outcome_wait_skips_other_events_and_remembers_where_it_read() -> None:
    wait = OutcomeWait(entry="5-0", since="0-0", of=RESUME)
    assert wait.read(_reply((b"1-0", RAISED))) is None and wait.last == "1-0"
    other = {"type": "input.ignored", "at": 2, "code": "already_resumed",
             "input": {"entry": "4-0", "type": "interrupt.resume"}}
    mine = {**other, "input": {"entry": "5-0", "type": "interrupt.resume"}}
    outcome = wait.read(_reply((b"2-0", other), (b"3-0", mine)))
    assert outcome is not None and outcome.status is ResumeStatus.IGNORED and wait.last == "3-0"
