"""The seed app, its question typed: the answer must be `{"approved": <bool>}`."""

from examples.seed_app import decide as seed_decide
from examples.seed_app import decide_on, llm, tools  # noqa: F401  (the app's attributes)

ANSWER = {"type": "object", "properties": {"approved": {"type": "boolean"}},
          "required": ["approved"], "additionalProperties": False}


def decide(trigger, proposed):
    decision = seed_decide(trigger, proposed)
    if trigger.type == "tool.execute":
        decision["actions"][0]["response_schema"] = ANSWER
    return decision
