"""The app the e2e tests run: the seed scenario plus knobs the tests turn by message text.

- `call NAME {json}` lines in a user message make the scripted model ask for tool calls;
- `[slow-llm]` / `[llm-1s]` in the last user message make the model take 3 s / 1 s;
- `[slow-decide]` makes decide take 3 s on that message;
- `[deadline]` in send_email's arguments asks with `timeout_s: 1`, default not approved
  (`[deadline-3s]`: `timeout_s: 3`; `[deadline-hour]`: `timeout_s: 3600`, a deadline that stays
  open through a test);
- `[parallel]` makes decide answer message.created with an LLM call and a `lookup` tool
  call at once; `lookup` completing raises a `review` interrupt (so the branch parks while
  that LLM call is in flight: I4).
"""

import time
from typing import Any

from parley import interrupt
from parley.workers.llm import ScriptedModel

_model = ScriptedModel().when(r"email (?P<to>\S+?):?\s+(?P<body>.+)", "send_email")


def llm(request: dict[str, Any]) -> dict[str, Any]:
    users = [m for m in request["messages"] if m["role"] == "user"]
    if users and request["messages"][-1]["role"] == "user":
        if "[slow-llm]" in users[-1]["content"]:
            time.sleep(3)
        elif "[llm-1s]" in users[-1]["content"]:
            time.sleep(1)
    return _model(request)


def decide(trigger, proposed):
    if trigger.type == "message.created" and "[decide-raises]" in trigger.message["content"]:
        raise RuntimeError("decide blew up")
    if trigger.type == "message.created" and "[decide-invalid]" in trigger.message["content"]:
        return {"actions": [{"type": "tool.result", "result": "no call to settle"}]}
    if trigger.type == "message.created" and "[slow-decide]" in trigger.message["content"]:
        time.sleep(3)
    if trigger.type == "tool.execute" and trigger.name == "send_email":
        ask = {"type": "interrupt", "reason": "confirm", "payload": {"message": "Send the email?"}}
        if "[deadline]" in str(trigger.arguments):
            ask.update(timeout_s=1, default={"approved": False})
        elif "[deadline-3s]" in str(trigger.arguments):
            ask.update(timeout_s=3, default={"approved": False})
        if "[deadline-hour]" in str(trigger.arguments):
            ask.update(timeout_s=3600, default={"approved": False})
        if "[guarded]" in str(trigger.arguments):
            ask.update(resumable_by=["alice"])
        return {"actions": [ask]}
    if trigger.type == "message.created" and "[parallel]" in trigger.message["content"]:
        return {"actions": [{"type": "llm.call"},
                            {"type": "tool.execute", "name": "lookup", "arguments": {"q": "x"}}]}
    if trigger.type == "tool.completed" and trigger.name == "lookup":
        return {"actions": [{"type": "interrupt", "reason": "review"}]}
    if trigger.type == "interrupt.resumed":
        payload = trigger.payload or {}
        if trigger.origin and trigger.origin.get("name") == "send_email":
            return ({"actions": [{"type": "tool.result", "result": "sent"}]} if payload.get("approved")
                    else {"actions": [{"type": "tool.error", "error": "declined"}]})
        return proposed
    return proposed


def send_email(to: str, body: str) -> str:
    """Send an email."""
    return "sent"


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return f"slept {seconds}"


def slow_idem(seconds: float) -> str:
    """Sleep, then answer; safe to run twice."""
    time.sleep(seconds)
    return f"slept {seconds}"


slow_idem.idempotent = True  # type: ignore[attr-defined]


def slow_limited(seconds: float) -> str:
    """Sleep, but never longer than a second (fn.timeout_s)."""
    time.sleep(seconds)
    return "finished"


slow_limited.timeout_s = 1  # type: ignore[attr-defined]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def boom() -> str:
    """Always fails."""
    raise RuntimeError("boom")


def later(what: str) -> str:
    """Settled from outside by a tool.result input."""
    raise AssertionError("a deferred tool never runs")


later.deferred = True  # type: ignore[attr-defined]


def transfer(amount: int, log: str = "") -> str:
    """Move money, asking from inside the tool which account, then for a confirmation.

    Args:
        amount: how much
        log: a file each run appends a line to (a test counts the runs: each answer runs the
            tool again from its start)
    """
    if log:
        with open(log, "a") as f:
            f.write("run\n")
    account = interrupt("which_account", {"amount": amount},
                        response_schema={"type": "string", "enum": ["checking", "savings"]})
    try:
        confirmed = interrupt("confirm", {"account": account, "amount": amount})
    except Exception:  # a tool's broad except must not swallow its question
        return "the question was swallowed"
    return f"moved {amount} from {account}" if confirmed is True else "not confirmed"


tools = [send_email, lookup, slow, slow_idem, slow_limited, add, boom, later, transfer]
