"""An app with a gated tool whose every run leaves evidence outside Redis: `pay` appends a line
to the file `$PARLEY_TEST_PAID_LOG` names, so a test can count what really ran, whatever Redis
says. Only `alice` may approve it. The scripted model asks for what `call pay {json}` lines
in the user's message say."""

import os

import orjson

from parley import ScriptedModel, needs_approval

PAID_LOG = "PARLEY_TEST_PAID_LOG"


@needs_approval(approvers=["alice"], message="Pay?")
def pay(to: str, amount: int) -> str:
    """Pay someone."""
    with open(os.environ[PAID_LOG], "ab") as log:
        log.write(orjson.dumps({"to": to, "amount": amount}) + b"\n")
    return f"paid {amount} to {to}"


def decide(trigger, proposed):
    return proposed


# an honest decide on both: what a compromised worker forges comes in its place
decide_on = {"tool.execute", "interrupt.resumed"}
tools = [pay]
llm = ScriptedModel()
