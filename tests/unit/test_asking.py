"""`parley.interrupt()` on the worker's side (workers/asking.py): answers by place, the first
question past them stops the run, and a question the engine could not raise fails at once in
the tool's own code."""

from typing import Any

import pytest

from parley.workers import awaiting
from parley.workers.asking import ToolAsked, answering, interrupt


def two_questions() -> tuple[Any, Any]:
    first = interrupt("first", {"n": 1})
    second = interrupt("second", timeout_s=5, default="no")
    return first, second


def test_the_nth_question_returns_the_nth_answer_and_the_first_past_them_stops_the_run():
    with answering([]), pytest.raises(ToolAsked) as asked:
        two_questions()
    assert asked.value.question == {"reason": "first", "payload": {"n": 1}}
    with answering(["a"]), pytest.raises(ToolAsked) as asked:
        two_questions()
    assert asked.value.question == {"reason": "second", "payload": None, "timeout_s": 5.0, "default": "no"}
    with answering(["a", "b"]):
        assert two_questions() == ("a", "b")


def test_a_broad_except_in_the_tool_does_not_swallow_the_question():
    def tool() -> str:
        try:
            return str(interrupt("q"))
        except Exception:
            return "swallowed"

    with answering([]), pytest.raises(ToolAsked):
        tool()


def test_an_async_tool_asks_on_the_event_loop():
    async def tool() -> str:
        return f"got {interrupt('q')}"

    with answering([]), pytest.raises(ToolAsked):
        awaiting.resolved(tool())
    with answering([7]):
        assert awaiting.resolved(tool()) == "got 7"


def test_outside_a_tool_it_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="return an Interrupt action instead"):
        interrupt("q")


@pytest.mark.parametrize("kwargs, says", [
    ({"reason": ""}, "`reason`"),
    ({"reason": "q", "timeout_s": -1}, "`timeout_s`"),
    ({"reason": "q", "resumable_by": "alice"}, "`resumable_by`"),
    ({"reason": "q", "payload": {1, 2}}, "JSON values"),
    ({"reason": "q", "payload": object()}, "JSON values"),
])
def test_a_question_the_engine_could_not_raise_fails_in_the_tools_code(kwargs: dict[str, Any], says: str):
    with answering(["never given"]), pytest.raises(ValueError, match=r"parley\.interrupt\(\)") as exc:
        interrupt(**kwargs)
    assert says in str(exc.value)
