"""The app the inbox's browser tests run (tests/e2e/test_inbox_browser.py): every question the
inbox page has to show, chosen by the user message's text.

"pay <to>: <text>" makes the scripted model call `pay` (a conversation with a tool call before
the question); decide asks before paying, and the markers in the text choose the question:

- no marker: reason `confirm`, no `response_schema`: the page offers Approve / Decline
  (`{"approved": true}` / `{"approved": false}`);
- `[form]`: reason `payment`, with PAYMENT_SCHEMA (a string, a number with `maximum: 100`, a
  boolean, an enum, an object and an array of strings): the page generates a form;
- `[bob-only]`: `resumable_by: ["bob"]` (anyone else sees it read-only);
- `[deadline-3s]`: `timeout_s: 3`, default `{"approved": false}` (`[deadline-1h]`: an hour, a
  deadline that stays ahead through a test).

The markers are left out of the question's payload (the page shows what a person would read).

"look up <what>" makes the model call `lookup` first; its result raises a `review` question
(so the conversation up to the question holds a tool call and its result).

An answer settles the call: approved (or a form's answer) is the tool's result, declined its
error; the model then sums up, and the turn completes.
"""

import json
import re
from typing import Any

from parley.workers.llm import ScriptedModel

PAYMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "maximum": 100, "description": "At most 100."},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "urgent": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 200},
        "payee": {"type": "object",
                  "properties": {"name": {"type": "string", "minLength": 1}, "iban": {"type": "string"}},
                  "required": ["name"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["amount", "currency", "payee"],
}

llm = (ScriptedModel()
       .when(r"pay (?P<to>\S+?):?\s+(?P<memo>.+)", "pay")
       .when(r"look up (?P<what>.+)", "lookup"))


MARKER = re.compile(r"\s*\[[a-z0-9-]+\]")


def decide(trigger: Any, proposed: dict[str, Any]) -> dict[str, Any]:
    if trigger.type == "tool.execute" and trigger.name == "pay":
        text = str(trigger.arguments)
        payment = {name: MARKER.sub("", str(value)).strip() for name, value in trigger.arguments.items()}
        ask: dict[str, Any] = {"type": "interrupt", "reason": "confirm",
                               "payload": {"message": "Make this payment?", "payment": payment}}
        if "[form]" in text:
            ask.update(reason="payment", response_schema=PAYMENT_SCHEMA,
                       payload={"message": "How much, to whom?", "invoice": payment})
        if "[bob-only]" in text:
            ask.update(resumable_by=["bob"])
        if "[deadline-3s]" in text:
            ask.update(timeout_s=3, default={"approved": False})
        if "[deadline-1h]" in text:
            ask.update(timeout_s=3600, default={"approved": False})
        return {"actions": [ask]}
    if trigger.type == "tool.completed" and trigger.name == "lookup":
        return {"actions": [{"type": "interrupt", "reason": "review",
                             "payload": {"message": "Is this lookup right?", "found": trigger.result}}]}
    if trigger.type == "interrupt.resumed" and trigger.reason in ("confirm", "payment"):
        answer = trigger.payload or {}
        if trigger.reason == "payment":
            return {"actions": [{"type": "tool.result", "result": "paid " + json.dumps(answer)}]}
        return ({"actions": [{"type": "tool.result", "result": "paid"}]} if answer.get("approved")
                else {"actions": [{"type": "tool.error", "error": "declined"}]})
    return proposed


# The triggers decide() looks at; the others take `proposed` at once, with no job.
decide_on = {"tool.execute", "tool.completed", "interrupt.resumed"}


def pay(to: str, memo: str) -> str:
    """Pay someone.

    Args:
        to: who is paid
        memo: what for
    """
    # Never runs: decide() settles the call from the approver's answer.
    return "paid"


def lookup(what: str) -> str:
    """Look something up."""
    return f"found {what}"


tools = [pay, lookup]
