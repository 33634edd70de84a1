"""A deterministic model for demos and tests: same transcript in, same reply out.

It reads the last message of the request:
- a user message with a line `call NAME {json-arguments}` (one per line) asks for those
  tool calls; otherwise the first rule whose pattern matches picks a tool call; with no
  match it answers `You said: ...`;
- tool results are summed up in one reply: `NAME: content` per call of the last turn,
  `(error)` marking failures.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CALL_LINE = re.compile(r"^\s*call\s+([A-Za-z0-9_.:-]+)\s*(\{.*\})?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    tool: str
    arguments: Callable[[re.Match[str]], dict[str, Any]]


@dataclass
class ScriptedModel:
    rules: list[Rule] = field(default_factory=list)

    def when(self, pattern: str, tool: str,
             arguments: Callable[[re.Match[str]], dict[str, Any]] | None = None) -> "ScriptedModel":
        self.rules.append(Rule(re.compile(pattern, re.IGNORECASE), tool,
                               arguments or (lambda m: m.groupdict())))
        return self

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        if not messages:
            return {"content": "Hello.", "tool_calls": [], "usage": {"tokens": 1}}
        last = messages[-1]
        if last.get("role") == "tool":
            return self._summary(messages)
        text = str(last.get("content", ""))
        calls = [{"id": f"s{i}", "name": m.group(1), "arguments": json.loads(m.group(2) or "{}")}
                 for i, m in enumerate(CALL_LINE.finditer(text), 1)]
        if not calls:
            for rule in self.rules:
                match = rule.pattern.search(text)
                if match:
                    calls = [{"id": "s1", "name": rule.tool, "arguments": rule.arguments(match)}]
                    break
        if calls:
            return {"content": "", "tool_calls": calls, "usage": {"tokens": len(text.split()) + 1}}
        return {"content": f"You said: {text}", "tool_calls": [], "usage": {"tokens": len(text.split()) + 3}}

    @staticmethod
    def _summary(messages: list[dict[str, Any]]) -> dict[str, Any]:
        names: dict[str, str] = {}
        results: list[str] = []
        for m in messages:
            for call in m.get("tool_calls") or []:
                names[call["id"]] = call["name"]
        for m in reversed(messages):
            if m.get("role") != "tool":
                break
            mark = " (error)" if m.get("error") else ""
            results.append(f"{names.get(m.get('tool_call_id', ''), 'tool')}{mark}: {m['content']}")
        results.reverse()
        return {"content": "Done. " + "; ".join(results), "tool_calls": [], "usage": {"tokens": 5}}


scripted = ScriptedModel()
