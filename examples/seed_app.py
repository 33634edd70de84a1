"""The seed scenario: the worker pauses before a sensitive action, then acts on the answer.

    parley dispatcher --app examples.seed_app
    parley worker --app examples.seed_app
    parley send s-42 "Email bob@example.com: the launch moved to Friday."
    parley resume s-42 int-1 '{"approved": true}'

`pay` is the other way to ask: declared `needs_approval`, it is never run until a person
approved that very call (its arguments' digest) - whatever decide or the model say:

    parley send s-43 "pay acme 120 EUR"
    parley resume s-43 int-1 '{"approved": true}'
"""

from parley import ScriptedModel, needs_approval


def decide(trigger, proposed):
    if trigger.type == "tool.execute" and trigger.name == "send_email":
        return {"actions": [{"type": "interrupt", "reason": "confirm",
                             "payload": {"message": "Send the email?"}}]}

    # Only the answer to our own question: a budget stop is resumed with reason "budget".
    if trigger.type == "interrupt.resumed" and trigger.reason == "confirm":
        return ({"actions": [{"type": "tool.result", "result": "sent"}]}
                if (trigger.payload or {}).get("approved")
                else {"actions": [{"type": "tool.error", "error": "declined"}]})

    return proposed


# The triggers decide() looks at; the others take `proposed` at once, with no job.
decide_on = {"tool.execute", "interrupt.resumed"}


def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: the recipient's address
        body: the text of the email
    """
    # Never runs in this app: decide() settles the call from the human's answer.
    return "sent"


@needs_approval(message="Pay this invoice?")
def pay(to: str, amount: str) -> str:
    """Pay an invoice.

    Args:
        to: the payee
        amount: the amount, with its currency
    """
    # Runs only once a person approved this call: the engine asks, decide() need not.
    return f"paid {amount} to {to}"


tools = [send_email, pay]

# A deterministic stand-in for a model: "email <address>: <text>" asks for send_email,
# "pay <payee> <amount>" for pay.
llm = (ScriptedModel().when(r"email (?P<to>\S+?):?\s+(?P<body>.+)", "send_email")
       .when(r"^pay (?P<to>\S+) (?P<amount>.+)", "pay"))
