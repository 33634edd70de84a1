"""Apps with sub-agents for the e2e tests (docs/protocol.md, Tools: `fn.agent`).

The parent's `research` tool is a sub-agent running `researcher`; the researcher's
`publish` tool asks a human first; its `dig` tool is itself a sub-agent (`digger`).
"""

import json
import time
from types import SimpleNamespace
from typing import Any

from parley.workers.llm import ScriptedModel


def research(topic: str) -> str:
    """Research a topic (runs as a child session)."""
    raise AssertionError("a sub-agent tool's body never runs")


research.agent = "tests.apps.agents:researcher"  # type: ignore[attr-defined]


def send_email(to: str, body: str) -> str:
    """Send an email."""
    return "sent"


def parent_decide(trigger: Any, proposed: Any) -> Any:
    if trigger.type == "tool.execute" and trigger.name == "send_email":
        return {"actions": [{"type": "interrupt", "reason": "confirm"}]}
    if trigger.type == "interrupt.resumed":
        return {"actions": [{"type": "tool.result", "result": "sent"}]}
    return proposed


decide = parent_decide
tools = [research, send_email]
llm = ScriptedModel()


# ---- the researcher: a child app -------------------------------------------------------------

def publish(text: str) -> str:
    """Publish the findings."""
    return f"published {text}"


def slow_read(seconds: float) -> str:
    """Read slowly."""
    time.sleep(seconds)
    return "read"


def dig(depth: int) -> str:
    """Dig deeper (a sub-agent of the sub-agent)."""
    raise AssertionError("a sub-agent tool's body never runs")


dig.agent = "tests.apps.agents:digger"  # type: ignore[attr-defined]


def researcher_llm(request: dict[str, Any]) -> dict[str, Any]:
    """The child's first message is the call's arguments as JSON text."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedModel()(request)
    task = json.loads(messages[0]["content"])
    topic = task.get("topic", "")
    if "slow" in topic:
        return {"content": "", "tool_calls": [{"id": "a", "name": "slow_read", "arguments": {"seconds": 2}}]}
    if "deep" in topic:
        return {"content": "", "tool_calls": [{"id": "a", "name": "dig", "arguments": {"depth": 1}}]}
    if "fail" in topic:
        return {"content": 5, "tool_calls": []}  # not a valid reply: the child ends with llm.failed
    return {"content": "", "tool_calls": [{"id": "a", "name": "publish", "arguments": {"text": topic}}]}


def researcher_decide(trigger: Any, proposed: Any) -> Any:
    if trigger.type == "tool.execute" and trigger.name == "publish":
        return {"actions": [{"type": "interrupt", "reason": "confirm", "payload": {"publish": True}}]}
    if trigger.type == "interrupt.resumed":
        return {"actions": [{"type": "tool.execute"}]} if (trigger.payload or {}).get("approved") else \
            {"actions": [{"type": "tool.error", "error": "not approved"}]}
    return proposed


researcher = SimpleNamespace(decide=researcher_decide, tools=[publish, slow_read, dig], llm=researcher_llm)

digger = SimpleNamespace(llm=lambda request: {"content": f"dug {request['messages'][0]['content']}",
                                              "tool_calls": []})
