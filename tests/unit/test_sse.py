"""workers/llm/sse.py: a streamed chat completion read line by line into its pieces, then into
the JSON of a non-streamed one."""

import json

import pytest

from parley.workers.llm.openai_compat import parse_response
from parley.workers.llm.sse import ChatStream, StreamError


def lines(*chunks: object) -> list[str]:
    out: list[str] = []
    for c in chunks:
        out += [f"data: {c if isinstance(c, str) else json.dumps(c)}", ""]
    return out


def delta(**fields: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def feed(stream: ChatStream, body: list[str]) -> list[str]:
    pieces = [p for line in body for p in stream.feed(line)]
    return pieces + stream.end()


def test_text_comes_piece_by_piece_and_adds_up_to_the_reply_with_its_usage():
    s = ChatStream()
    body = [": keep-alive", *lines(delta(role="assistant", content=""), delta(content="Hel"),
                                   delta(content="lo"), {"choices": [], "usage": {"total_tokens": 9}},
                                   "[DONE]")]
    assert feed(s, body) == ["Hel", "lo"]
    assert s.done
    assert parse_response(s.completion()) == {"content": "Hello", "tool_calls": [], "usage": {"tokens": 9}}


def test_tool_calls_are_put_together_from_their_fragments_by_index():
    s = ChatStream()
    body = lines(delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "look", "arguments": ""}}]),
                 delta(tool_calls=[{"index": 1, "id": "c2",
                                    "function": {"name": "add", "arguments": '{"a"'}}]),
                 delta(tool_calls=[{"index": 0, "function": {"arguments": '{"q": "x"}'}}]),
                 delta(tool_calls=[{"index": 1, "function": {"arguments": ": 1}"}}]), "[DONE]")
    assert feed(s, body) == []
    assert parse_response(s.completion())["tool_calls"] == [
        {"id": "c1", "name": "look", "arguments": {"q": "x"}},
        {"id": "c2", "name": "add", "arguments": {"a": 1}}]


def test_an_event_of_several_data_lines_and_one_not_closed_by_a_blank_line():
    s = ChatStream()
    assert s.feed('data: {"choices": [{"index": 0,') == []
    assert s.feed('data:  "delta": {"content": "x"}}]}') == []
    assert s.feed("") == ["x"]
    assert s.feed('data: {"choices": [{"index": 0, "delta": {"content": "y"}}]}') == []
    assert s.end() == ["y"]


def test_other_choices_and_fields_are_ignored():
    s = ChatStream()
    body = lines({"choices": [{"index": 1, "delta": {"content": "other"}}]}, delta(content="mine"))
    assert feed(s, ["event: message", "id: 7", "retry: 10", *body]) == ["mine"]


@pytest.mark.parametrize(("chunk", "says"), [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"error": {"message": "overloaded"}}', "error mid-stream"),
])
def test_a_stream_that_is_not_a_completion_is_an_error(chunk: str, says: str):
    with pytest.raises(StreamError, match=says):
        feed(ChatStream(), [f"data: {chunk}", ""])
