"""A bad decision is reported in one line naming the action, the field and the fix (issue 32),
never pydantic's internals (union tags, error types, its documentation's links)."""

from typing import Any

import pytest

from parley.schemas.actions import InvalidDecision, decision_from_app


@pytest.mark.parametrize(("value", "line"), [
    ({"actions": [{"type": "interupt", "reason": "x"}]},
     "actions[0]: unknown action type 'interupt' (did you mean 'interrupt'?); the types are llm.call, "
     "tool.execute, tool.result, tool.error, message, interrupt"),
    ("done", 'decide returned a str (\'done\'): return `proposed`, a `Decision`, a list of actions or '
             '{"actions": [...]}'),
    (7, "decide returned a int (7)"),
    ([{"type": "interrupt"}], "actions[0] (interrupt): `reason` is required"),
    ([{"type": "message", "content": "ok"}, {"type": "tool.result"}],
     "actions[1] (tool.result): `result` is required"),
    ([{"type": "interrupt", "reason": "x", "timout_s": 5}],
     "actions[0] (interrupt): unknown field 'timout_s' (did you mean 'timeout_s'?)"),
    ({"actions": [], "extra": 1}, "a decision holds `actions` only, not 'extra'"),
    ([{"type": "message", "content": 5}],
     "actions[0] (message): `content`: Input should be a valid string (got int 5)"),
    ([5], "actions[0]: an action is a dict (or an action object) with a `type`, not int 5"),
    ([{"content": "x"}], "actions[0]: an action needs a `type`, one of llm.call"),
    ({"actions": "x"}, "`actions` must be a list of actions, not str 'x'"),
])
def test_a_bad_decision_gets_one_readable_line(value: Any, line: str) -> None:
    with pytest.raises(InvalidDecision) as caught:
        decision_from_app(value)
    said = str(caught.value)
    assert said.startswith(line) and "\n" not in said
    assert "errors.pydantic.dev" not in said and "union_tag" not in said and "type=" not in said


def test_every_error_of_a_decision_is_named_once() -> None:
    with pytest.raises(InvalidDecision) as caught:
        decision_from_app([{"type": "interrupt"}, {"type": "mesage", "content": "x"}])
    assert str(caught.value) == (
        "actions[0] (interrupt): `reason` is required; actions[1]: unknown action type 'mesage' "
        "(did you mean 'message'?); the types are llm.call, tool.execute, tool.result, tool.error, "
        "message, interrupt")


def test_the_typed_actions_are_exported_and_read_as_the_dicts_they_stand_for() -> None:
    """Issue 32: action models with editor completion, beside the plain dicts."""
    import parley

    typed = decision_from_app([
        parley.Message(content="Checking."),
        parley.ToolExecute(),
        parley.ToolResult(call_id="call-2", result={"ok": True}),
        parley.ToolError(call_id="call-3", error="over the limit"),
        parley.LlmCall(model="small"),
        parley.Interrupt(reason="confirm", payload={"amount": 120}, timeout_s=60, default={"ok": False}),
    ])
    plain = decision_from_app([
        {"type": "message", "content": "Checking."}, {"type": "tool.execute"},
        {"type": "tool.result", "call_id": "call-2", "result": {"ok": True}},
        {"type": "tool.error", "call_id": "call-3", "error": "over the limit"},
        {"type": "llm.call", "model": "small"},
        {"type": "interrupt", "reason": "confirm", "payload": {"amount": 120}, "timeout_s": 60,
         "default": {"ok": False}}])
    assert typed.to_wire() == plain.to_wire()
    assert parley.Decision(actions=[parley.Message(content="x")]).to_wire() == {
        "actions": [{"type": "message", "content": "x"}]}
    with pytest.raises(parley.InvalidDecision, match="did you mean 'message'"):
        decision_from_app([{"type": "mesage", "content": "x"}])
