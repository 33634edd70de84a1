"""A streamed chat completion (`"stream": true`), read as the server sends it.

The server answers with server-sent events: `data: {chunk}` lines, each event ended by a blank
line, and `data: [DONE]` at the end. Each chunk's `choices[0].delta` holds the next piece of
the reply's text (`content`) and fragments of its tool calls (by `index`: the `id` and the
function's `name` once, its `arguments` as pieces of JSON text); the last chunk may carry
`usage` (asked for with `stream_options.include_usage`). `ChatStream` turns the lines into the
text pieces as they come, and at the end into the same JSON a non-streamed completion has, so
that one parser reads both. Pure: no I/O.
"""

import json
from typing import Any


class StreamError(ValueError):
    """The stream is not a chat completion's (a chunk that is not JSON, an error event)."""


class ChatStream:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self.done = False

    def feed(self, line: str) -> list[str]:
        """One line of the body (without its line break): the text pieces it completed."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):  # a comment (keep-alive)
            return []
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return []  # `event:`, `id:`, `retry:` mean nothing here

    def end(self) -> list[str]:
        """The body ended: an event not closed by a blank line still counts."""
        return self._dispatch()

    def _dispatch(self) -> list[str]:
        if not self._data:
            return []
        data = "\n".join(self._data)
        self._data.clear()
        if data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError(f"a streamed chunk is not JSON: {data[:300]}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"a streamed chunk is not a JSON object: {data[:300]}")
        if chunk.get("error") is not None:
            raise StreamError(f"the server reported an error mid-stream: {json.dumps(chunk['error'])[:300]}")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        pieces: list[str] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                continue
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text.append(content)
                pieces.append(content)
            for fragment in delta.get("tool_calls") or []:
                self._call_fragment(fragment)
        return pieces

    def _call_fragment(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            raise StreamError(f"a streamed tool call is not an object: {json.dumps(fragment)[:300]}")
        call = self._calls.setdefault(int(fragment.get("index", len(self._calls))),
                                      {"id": None, "name": "", "arguments": []})
        if fragment.get("id"):
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        if isinstance(function.get("name"), str):
            call["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["arguments"].append(function["arguments"])

    def completion(self) -> dict[str, Any]:
        """What was streamed, as a non-streamed chat completion's JSON."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        if self._calls:
            message["tool_calls"] = [
                {"id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": "".join(call["arguments"])}}
                for _index, call in sorted(self._calls.items())]
        out: dict[str, Any] = {"choices": [{"index": 0, "message": message}]}
        if self._usage is not None:
            out["usage"] = self._usage
        return out
