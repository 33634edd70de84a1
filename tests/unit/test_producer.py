"""The clients' pure parts (parley/client/producer.py): what both `Client` and `AsyncClient` do
between Redis calls, so the two are thin I/O shells over one logic."""

import orjson
import pytest

from parley.client.producer import (
    InvalidInput,
    OutcomeWait,
    SubmitRefused,
    SubmitUnavailable,
    check_producer,
    input_fields,
    resume_input,
    submit_call,
    submit_error,
    typed_events,
    xread_events,
)
from parley.schemas.events import InterruptRaised
from parley.schemas.inputs import MessageCreate, SessionCreate
from parley.schemas.keys import Keys, partition_of
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


# ---- the submit function's call and replies (docs/protocol.md, "Writing inputs") -----------------

def test_submit_call_names_the_producers_own_stream_of_the_sessions_partition() -> None:
    fields = input_fields("s-1", {"type": "session.create"}, "k1")
    call = submit_call(Keys(), "app", "s-1", 1, fields)
    assert call[:6] == ("parley_submit", 2, "parley:in:app", "parley:pending:app", "parley", "app")
    assert dict(zip(call[6::2], call[7::2], strict=True)) == fields
    n = partition_of("s-1", 8)
    assert submit_call(Keys("acme:p"), "app", "s-1", 8, fields)[2:6] == (
        f"acme:p:in:app:{n}", "acme:p:pending:app", "acme:p", "app")


@pytest.mark.parametrize(("reply", "code", "message"), [
    ("PARLEY rate_limited 100 inputs of session s-1 are pending", "rate_limited",
     "100 inputs of session s-1 are pending"),
    ("PARLEY too_large the entry has 5000000 bytes, over the limit of 1048576", "too_large",
     "the entry has 5000000 bytes, over the limit of 1048576"),
    ("PARLEY session_full session s-1 has 10000 messages, the limit", "session_full",
     "session s-1 has 10000 messages, the limit"),
    ("PARLEY wrong_tenant session b/s is outside this producer's keys", "wrong_tenant",
     "session b/s is outside this producer's keys"),
])
def test_a_refusal_reply_becomes_submit_refused_with_its_code(reply: str, code: str, message: str) -> None:
    error = submit_error(reply)
    assert isinstance(error, SubmitRefused)
    assert (error.code, error.message) == (code, message)
    assert str(error) == f"{code}: {message}"


def test_a_missing_function_is_a_retryable_error_and_other_errors_are_not_ours() -> None:
    assert isinstance(submit_error("Function not found"), SubmitUnavailable)
    assert submit_error("WRONGTYPE Operation against a key holding the wrong kind of value") is None
    assert submit_error("NOPERM this user has no permissions to access one of the keys") is None


@pytest.mark.parametrize("name", ["app", "a", "acme-app_2", "x" * 32])
def test_a_producer_name_is_lowercase_without_colons(name: str) -> None:
    assert check_producer(name) == name


@pytest.mark.parametrize("name", ["", "App", "a:b", "-a", "x" * 33, "a*", "a b"])
def test_a_bad_producer_name_is_refused_saying_the_rule(name: str) -> None:
    with pytest.raises(ValueError, match=r"invalid producer name .*\[a-z0-9_-\]"):
        check_producer(name)
