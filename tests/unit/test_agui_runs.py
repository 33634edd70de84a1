"""parley/agui/runs.py, interrupts.py and messages.py: what a run input asks, how a resume
entry is checked, how interrupts and messages read in AG-UI; no I/O."""

from typing import Any

import pytest
from ag_ui.core import ResumeEntry, RunAgentInput

from parley.agui.interrupts import Answer, agui_interrupt, answers_of, iso_of
from parley.agui.messages import active_line, snapshot_messages
from parley.agui.runs import RunProblem, cursor_of, request_of, state_with
from parley.client.inbox import OpenInterrupt
from parley.schemas.events import EVENT_ADAPTER


def run(messages: list[dict[str, Any]], **more: Any) -> RunAgentInput:
    return RunAgentInput.model_validate({"threadId": "t-1", "runId": "r-1", "messages": messages, **more})


USER = {"id": "u-1", "role": "user", "content": "hi"}


def test_a_run_sends_its_last_message_when_it_is_a_users_keeping_its_id() -> None:
    request = request_of(run([{"id": "a-0", "role": "assistant", "content": "hello"}, USER]))
    assert request.session == "t-1" and request.message is not None
    assert (request.message.content, request.message.message_id) == ("hi", "u-1")
    assert request.message.idempotency_key == "agui:r-1:u-1"  # the same run twice: one message


def test_a_message_id_parley_cannot_keep_is_minted_and_text_parts_are_joined() -> None:
    parts = {"id": "u 1!", "role": "user",
             "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    request = request_of(run([parts]))
    assert request.message is not None
    assert (request.message.content, request.message.message_id) == ("ab", None)


def test_a_part_that_is_not_text_is_a_clear_problem() -> None:
    image = {"id": "u-1", "role": "user", "content": [
        {"type": "image", "source": {"type": "url", "value": "https://example.com/a.png"}}]}
    with pytest.raises(RunProblem) as caught:
        request_of(run([image]))
    assert caught.value.code == "unsupported_content" and "image" in str(caught.value)


def test_a_run_whose_last_message_is_not_a_users_only_follows() -> None:
    assert request_of(run([USER, {"id": "a-1", "role": "assistant", "content": "x"}])).follows_only
    assert request_of(run([])).follows_only


def test_resume_entries_come_before_messages_and_an_interrupt_answered_twice_is_refused() -> None:
    entry = {"interruptId": "int-1", "status": "resolved", "payload": {"approved": True}}
    request = request_of(run([USER], resume=[entry]))
    assert request.message is None and [e.interrupt_id for e in request.resumes] == ["int-1"]
    with pytest.raises(RunProblem) as caught:
        request_of(run([USER], resume=[entry, entry]))
    assert caught.value.code == "invalid_resume"


@pytest.mark.parametrize("thread", ["has space", "x" * 129, "s-1:sub-2", ""])
def test_a_thread_id_that_cannot_be_a_session_id_is_refused(thread: str) -> None:
    with pytest.raises(RunProblem) as caught:
        request_of(RunAgentInput.model_validate({"threadId": thread, "runId": "r", "messages": []}))
    assert caught.value.code == "invalid_thread"


def test_the_cursor_comes_back_in_the_state_only_for_its_own_session() -> None:
    state = state_with({"theme": "dark"}, "t-1", "1700000000000-3")
    assert state == {"theme": "dark", "parley": {"session": "t-1", "cursor": "1700000000000-3"}}
    assert cursor_of(state, "t-1") == "1700000000000-3"
    assert cursor_of(state, "t-2") is None
    assert cursor_of({"parley": {"session": "t-1", "cursor": "$"}}, "t-1") is None  # not an id
    assert cursor_of("not a dict", "t-1") is None
    assert request_of(run([USER], state=state)).cursor == "1700000000000-3"


def row(**fields: Any) -> OpenInterrupt:
    base: dict[str, Any] = {"session": "t-1", "interrupt_id": "int-1", "reason": "approval", "raised_at": 1,
                            "request": {"message": "Pay this invoice?", "call_id": "call-2", "tool": "pay"},
                            "response_schema": {"type": "object", "required": ["approved"],
                                                "properties": {"approved": {"type": "boolean"}}}}
    return OpenInterrupt.model_validate({**base, **fields})


def entry(status: str = "resolved", payload: Any = None, interrupt_id: str = "int-1") -> ResumeEntry:
    return ResumeEntry(interrupt_id=interrupt_id, status=status, payload=payload)  # type: ignore[arg-type]


def test_an_open_interrupt_in_agui_names_its_call_schema_deadline_and_default() -> None:
    shown = agui_interrupt(row(expires_at=1764558000000, default={"approved": False}, resumable_by=["desk"]))
    wire = shown.model_dump(by_alias=True)
    assert (wire["id"], wire["reason"], wire["message"], wire["toolCallId"]) == \
        ("int-1", "approval", "Pay this invoice?", "call-2")
    assert wire["expiresAt"] == "2025-12-01T03:00:00.000Z" == iso_of(1764558000000)
    assert wire["metadata"]["parley"]["default"] == {"approved": False}
    assert wire["metadata"]["parley"]["resumableBy"] == ["desk"]
    assert "default" not in agui_interrupt(row()).model_dump(by_alias=True)["metadata"]["parley"]


def test_a_tools_own_question_names_the_call_that_asked_it() -> None:
    raised = EVENT_ADAPTER.validate_python({"type": "interrupt.raised", "at": 1, "interrupt_id": "int-1",
                                            "reason": "receipt", "payload": "Which receipt?",
                                            "call_id": "call-7"})
    shown = agui_interrupt(row(reason="receipt", request="Which receipt?"), raised)  # type: ignore[arg-type]
    assert (shown.tool_call_id, shown.message) == ("call-7", None)


def test_answers_are_checked_all_before_any_is_sent() -> None:
    rows = {"int-1": row(), "int-2": row(interrupt_id="int-2")}
    good = entry(payload={"approved": True})
    assert answers_of([good], rows, None) == [Answer("int-1", {"approved": True}, cancelled=False)]
    with pytest.raises(RunProblem) as caught:
        answers_of([good, entry(payload={"approved": "yes"}, interrupt_id="int-2")], rows, None)
    assert caught.value.code == "invalid_resume" and "$.approved" in str(caught.value)


@pytest.mark.parametrize(("rows", "given", "principal", "code"), [
    ({}, entry(payload={"approved": True}), "desk", "unknown_interrupt"),
    ({"int-1": row(resumable_by=["alice"])}, entry(payload={"approved": True}), "desk", "forbidden"),
    ({"int-1": row(resumable_by=["alice"])}, entry(payload={"approved": True}), None, "forbidden"),
    ({"int-1": row()}, entry("cancelled"), "desk", "cannot_cancel"),
])
def test_an_answer_the_engine_would_refuse_is_refused_here_first(rows: dict[str, OpenInterrupt],
                                                                 given: ResumeEntry, principal: str | None,
                                                                 code: str) -> None:
    with pytest.raises(RunProblem) as caught:
        answers_of([given], rows, principal)
    assert caught.value.code == code


def test_cancelling_an_interrupt_with_a_deadline_answers_its_default() -> None:
    rows = {"int-1": row(expires_at=5, default={"approved": False})}
    assert answers_of([entry("cancelled")], rows, None) == \
        [Answer("int-1", {"approved": False}, cancelled=True)]


VIEW = {"head": "msg-4", "messages": [
    {"id": "u-1", "parent_id": None, "role": "user", "content": "Pay acme"},
    {"id": "u-0", "parent_id": None, "role": "user", "content": "an edit on another line"},
    {"id": "msg-2", "parent_id": "u-1", "role": "assistant", "content": "",
     "tool_calls": [{"id": "call-1", "name": "pay", "arguments": {"to": "acme"}}]},
    {"id": "msg-3", "parent_id": "msg-2", "role": "tool", "content": "paid", "tool_call_id": "call-1"},
    {"id": "msg-4", "parent_id": "msg-3", "role": "assistant", "content": "Done."}]}


def test_the_snapshot_is_the_active_line_in_agui_shapes() -> None:
    assert [m["id"] for m in active_line(VIEW)] == ["u-1", "msg-2", "msg-3", "msg-4"]
    wire = [m.model_dump(by_alias=True) for m in snapshot_messages(VIEW)]
    assert [m["role"] for m in wire] == ["user", "assistant", "tool", "assistant"]
    assert wire[1]["toolCalls"] == [{"id": "call-1", "type": "function",
                                     "function": {"name": "pay", "arguments": '{"to":"acme"}'}}]
    assert "content" not in wire[1]  # no text: no content
    assert (wire[2]["toolCallId"], wire[2]["content"]) == ("call-1", "paid")


def test_a_tree_with_a_loop_ends_the_walk() -> None:
    looped = {"head": "a", "messages": [{"id": "a", "parent_id": "b", "role": "user", "content": ""},
                                        {"id": "b", "parent_id": "a", "role": "user", "content": ""}]}
    assert len(active_line(looped)) <= 3
