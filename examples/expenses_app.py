"""An expense agent written with Parley's typed API: every way a person is asked, in one app.

    parley dispatcher --app examples.expenses_app
    parley worker --app examples.expenses_app
    parley send e-1 "expense 42.50 taxi to the airport"
    parley resume e-1 int-1 '{"receipt": "R-1001"}'      # file_expense asked for its receipt
    parley send e-1 "reimburse 42.50"
    parley resume e-1 int-2 '{"approved": true}'         # reimburse needs a person's approval

- `policy_limit` is an `async def` tool: it runs on the worker's event loop.
- `file_expense` asks for the receipt from inside its own code (`interrupt()`): the branch
  parks, and once answered the tool runs again from its start with the call returning the
  answer. Above `REVIEW_OVER` euros, `decide` first asks finance to review the expense
  (`Interrupt`), and on their answer runs the call (`ToolExecute`) or refuses it (`ToolError`).
- `reimburse` is declared `needs_approval`: the engine runs no call of it until a person
  approved that very call, whatever `decide` or the model say.
"""

import asyncio
from typing import Any

from parley import Interrupt, ScriptedModel, ToolError, ToolExecute, Trigger, interrupt, tool

instructions = ("You help employees file their expenses. Check an expense against the policy "
                "limit, file it with its receipt, and reimburse it only when asked to.")

#: expenses above this many euros are reviewed by finance before they are filed
REVIEW_OVER = 500.0

#: the policy's limit per category, in euros (a real app reads its policy service)
LIMITS = {"taxi": 80.0, "hotel": 250.0, "travel": 1500.0}

RECEIPT = {"type": "object", "properties": {"receipt": {"type": "string", "minLength": 1, "maxLength": 64}},
           "required": ["receipt"], "additionalProperties": False}
APPROVED = {"type": "object", "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
            "required": ["approved"], "additionalProperties": False}


@tool(description="The most an expense of a category may be, in euros.")
async def policy_limit(category: str) -> float:
    """Args:
        category: the expense's category, e.g. taxi, hotel, travel
    """
    await asyncio.sleep(0)  # stands for the HTTP call to a policy service
    return LIMITS.get(category.lower(), 100.0)


@tool(timeout_s=30)
def file_expense(amount: str, purpose: str) -> str:
    """File an expense in the ledger.

    Args:
        amount: the amount in euros, e.g. 42.50
        purpose: what it was for
    """
    # Nothing with an effect happens before the question: this body runs again from its start
    # once the receipt number is given, and `interrupt` then returns it.
    answer = interrupt("receipt", {"message": f"Receipt number for {amount} EUR ({purpose})?"},
                       response_schema=RECEIPT)
    return f"filed {amount} EUR for {purpose} with receipt {answer['receipt']}"


@tool(needs_approval={"message": "Reimburse this expense?"})
def reimburse(amount: str) -> str:
    """Pay an expense back to the employee.

    Args:
        amount: the amount in euros
    """
    return f"reimbursed {amount} EUR"


tools = [policy_limit, file_expense, reimburse]


def decide(trigger: Trigger, proposed: Any) -> Any:
    if trigger.type == "tool.execute" and trigger.name == "file_expense" \
            and _euros(trigger.arguments.get("amount")) > REVIEW_OVER:
        return [Interrupt(reason="review", response_schema=APPROVED,
                          payload={"message": f"Review an expense of {trigger.arguments['amount']} EUR?",
                                   "purpose": trigger.arguments.get("purpose")})]
    # Only our own question: the engine asks its own too (a budget stop, an approval).
    if trigger.type == "interrupt.resumed" and trigger.reason == "review":
        answer = trigger.payload or {}
        return ([ToolExecute()] if answer.get("approved")
                else [ToolError(error=f"declined by finance: {answer.get('note') or 'no reason given'}")])
    return proposed


#: the triggers decide() looks at; the others take `proposed` at once, with no job
decide_on = {"tool.execute", "interrupt.resumed"}


def _euros(amount: Any) -> float:
    try:
        return float(amount)
    except (TypeError, ValueError):
        return 0.0


# A deterministic stand-in for a model (a real app sets `llm = OpenAICompatible()`).
llm = (ScriptedModel()
       .when(r"^limit for (?P<category>\w+)", "policy_limit")
       .when(r"^expense (?P<amount>\d+(?:\.\d+)?) (?P<purpose>.+)", "file_expense")
       .when(r"^reimburse (?P<amount>\d+(?:\.\d+)?)", "reimburse"))
