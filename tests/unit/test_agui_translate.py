"""parley/agui/translate.py: how a session's events and deltas read as AG-UI events, without I/O."""

from typing import Any

import pytest

from parley.agui.translate import Ending, Translator
from parley.schemas.deltas import Delta
from parley.schemas.events import EVENT_ADAPTER, Event


def ev(**fields: Any) -> Event:
    return EVENT_ADAPTER.validate_python({"at": 1, **fields})


def dumped(events: list[Any]) -> list[dict[str, Any]]:
    return [e.model_dump(by_alias=True) for e in events]


def kinds(events: list[Any]) -> list[str]:
    return [e.type.value if hasattr(e.type, "value") else e.type for e in events]


def piece(text: str, seq: int, attempt: int = 1, reset: bool = False) -> Delta:
    return Delta(call_id="llm-1", attempt=attempt, seq=seq, text=text, reset=reset)


def reply(content: str, message_id: str = "msg-2", calls: list[dict[str, Any]] | None = None) -> Event:
    message: dict[str, Any] = {"id": message_id, "parent_id": "u-1", "role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ev(type="message.created", message=message)


def user(message_id: str, content: str) -> dict[str, Any]:
    return {"id": message_id, "parent_id": None, "role": "user", "content": content}


COMPLETED = {"type": "llm.completed", "call_id": "llm-1", "head": "u-1", "message_id": "msg-2"}


def test_a_streamed_reply_is_one_text_message_under_the_calls_id_closed_when_recorded() -> None:
    t = Translator("s", frozenset())
    out = t.delta(piece("Hel", 1)) + t.delta(piece("lo", 2))
    assert kinds(out) == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"]
    assert {e.message_id for e in out} == {"llm-1"}
    assert t.event(reply("Hello")) == []  # held until its llm.completed names the call
    end = t.event(ev(**COMPLETED))
    assert kinds(end) == ["TEXT_MESSAGE_END"] and end[0].message_id == "llm-1"
    assert not t.needs_snapshot


def test_the_rest_of_a_reply_not_yet_streamed_is_written_before_its_end() -> None:
    t = Translator("s", frozenset())
    t.delta(piece("Hel", 1))
    t.event(reply("Hello there"))
    out = t.event(ev(**COMPLETED))
    assert [(k, getattr(e, "delta", None)) for k, e in zip(kinds(out), out, strict=True)] == \
        [("TEXT_MESSAGE_CONTENT", "lo there"), ("TEXT_MESSAGE_END", None)]


def test_a_reply_that_was_not_streamed_is_one_message_under_its_own_id_with_its_tool_calls() -> None:
    t = Translator("s", frozenset())
    t.event(reply("Paying.", calls=[{"id": "call-1", "name": "pay", "arguments": {"to": "acme"}}]))
    out = dumped(t.event(ev(**COMPLETED)))
    assert [e["type"] for e in out] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
                                        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
    assert out[0]["messageId"] == "msg-2" and out[1]["delta"] == "Paying."
    assert (out[3]["toolCallId"], out[3]["toolCallName"], out[3]["parentMessageId"]) == \
        ("call-1", "pay", "msg-2")
    assert out[4]["delta"] == '{"to":"acme"}'


def test_a_restarted_stream_ends_what_was_streamed_and_asks_for_a_snapshot() -> None:
    t = Translator("s", frozenset())
    t.delta(piece("The fir", 1))
    out = t.delta(piece("", 2, reset=True)) + t.delta(piece("The second", 3))
    assert kinds(out) == ["TEXT_MESSAGE_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    assert [e.message_id for e in out] == ["llm-1", "llm-1.2", "llm-1.2"]  # ids stay unique
    assert t.needs_snapshot


def test_a_new_attempt_after_a_lost_worker_is_a_new_message_too() -> None:
    t = Translator("s", frozenset())
    t.delta(piece("half a rep", 1))
    out = t.delta(piece("The whole reply", 1, attempt=2))
    assert kinds(out) == ["TEXT_MESSAGE_END", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    t.event(reply("The whole reply"))
    assert kinds(t.event(ev(**COMPLETED))) == ["TEXT_MESSAGE_END"]
    assert t.needs_snapshot  # the half reply is still on the front end: the snapshot replaces it


def test_a_reply_unlike_its_stream_asks_for_a_snapshot() -> None:
    t = Translator("s", frozenset())
    t.delta(piece("Yes", 1))
    t.event(reply("No"))
    t.event(ev(**COMPLETED))
    assert t.needs_snapshot


def test_a_tool_result_is_a_tool_call_result_and_an_unannounced_call_is_announced_first() -> None:
    t = Translator("s", frozenset())
    t.event(ev(type="tool.started", call_id="call-3", name="lookup"))
    out = dumped(t.event(ev(type="message.created", message={
        "id": "msg-5", "parent_id": "msg-4", "role": "tool", "content": "42", "tool_call_id": "call-3"})))
    assert [e["type"] for e in out] == \
        ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert out[0]["toolCallName"] == "lookup"
    assert (out[3]["messageId"], out[3]["toolCallId"], out[3]["content"], out[3]["role"]) == \
        ("msg-5", "call-3", "42", "tool")


def test_the_runs_own_user_message_is_not_echoed_but_another_producers_is() -> None:
    t = Translator("s", frozenset({"1-0"}))
    own = ev(type="message.created", message=user("u-1", "hi"),
             input={"entry": "1-0", "type": "message.create"})
    other = ev(type="message.created", message=user("u-2", "yo"),
               input={"entry": "2-0", "type": "message.create"})
    assert t.event(own) == []
    assert kinds(t.event(other)) == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]


def test_the_turn_ends_the_run_only_once_the_runs_input_is_applied_and_no_interrupt_is_open() -> None:
    t = Translator("s", frozenset({"5-0"}))
    t.event(ev(type="turn.completed", head="msg-1"))  # an earlier turn's end
    assert t.ending is None and not t.applied
    t.event(ev(type="message.created", message=user("u-1", "x"),
               input={"entry": "5-0", "type": "message.create"}))
    assert t.applied
    t.event(ev(type="interrupt.raised", interrupt_id="int-1", reason="approval", payload={}, call_id=None))
    t.event(ev(type="turn.completed", head="u-1"))
    assert t.ending is None and t.open_interrupts == {"int-1"}
    t.event(ev(type="interrupt.resumed", interrupt_id="int-1", payload={}, delivered=True, timed_out=False))
    t.event(ev(type="turn.completed", head="u-1"))
    assert t.ending == Ending("success")


def test_a_refusal_of_the_runs_own_input_ends_it_with_its_code_and_where() -> None:
    t = Translator("s", frozenset({"5-0"}))
    t.event(ev(type="input.refused", input={"entry": "4-0", "type": "interrupt.resume"}, code="forbidden",
               message="not yours"))
    assert t.ending is None  # another producer's
    t.event(ev(type="input.refused", input={"entry": "5-0", "type": "interrupt.resume"},
               code="invalid_resume", message="wrong type", path="$.approved"))
    assert t.ending == Ending("error", "invalid_resume", "wrong type (at $.approved)")


@pytest.mark.parametrize("code", ["duplicate", "already_resumed"])
def test_a_repeat_of_the_runs_input_follows_on_and_a_closed_session_cancels_the_run(code: str) -> None:
    t = Translator("s", frozenset({"5-0"}))
    t.event(ev(type="input.ignored", input={"entry": "5-0", "type": "message.create"}, code=code))
    assert t.ending is None and t.applied and t.repeated
    t.event(ev(type="session.closed", reason="closed"))
    assert t.ending == Ending("cancelled")


def test_an_ignored_input_that_is_no_repeat_ends_the_run() -> None:
    t = Translator("s", frozenset({"5-0"}))
    t.event(ev(type="input.ignored", input={"entry": "5-0", "type": "interrupt.resume"},
               code="unknown_interrupt"))
    assert t.ending == Ending("error", "unknown_interrupt", "the input was ignored: unknown_interrupt")


def test_another_branchs_turn_does_not_end_the_run_of_this_ones_message() -> None:
    t = Translator("s", frozenset({"5-0"}))
    t.event(ev(type="message.created", message={"id": "u-9", "parent_id": "msg-1", "role": "user",
                                                "content": "x"},
               input={"entry": "5-0", "type": "message.create"}))
    t.event(ev(type="turn.completed", head="msg-7"))  # a turn of another branch
    assert t.ending is None
    t.event(ev(type="message.created", message={"id": "msg-10", "parent_id": "u-9", "role": "assistant",
                                                "content": "done"}))
    t.event(ev(type="turn.completed", head="msg-10"))
    assert t.ending == Ending("success")


def test_close_ends_every_stream_still_open() -> None:
    t = Translator("s", frozenset())
    t.delta(piece("still thinking", 1))
    assert kinds(t.close()) == ["TEXT_MESSAGE_END"]
    assert t.close() == []
