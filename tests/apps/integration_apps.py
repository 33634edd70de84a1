"""Apps for tests/integration/test_app.py: good and broken shapes, reached as `module:attr`."""

from types import SimpleNamespace
from typing import Literal


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def shout(text: str) -> str:
    """Shout it."""
    return text.upper()


def my_decide(trigger, proposed):
    return proposed


def my_llm(request):
    return {"content": "ok", "tool_calls": []}


def describe(to: str, count: int, ratio: float = 0.5, tags: list[str] | None = None,
             mode: Literal["fast", "slow"] = "fast", urgent: bool = False, *extra, **options) -> str:
    """Describe a delivery.

    A second paragraph that is not part of the summary.

    Args:
        to (str): the recipient address
        count: how many to send
        mode: fast or slow
    Returns:
        a description
    """
    return f"{count} to {to}"


def untyped(thing, other=None):
    return thing


# module:attr with a namespace object
bundle = SimpleNamespace(tools={"twice": double, "loud": shout}, decide=my_decide,
                         decide_on=["tool.execute", "message.created"], llm=my_llm)
# module:attr.attr (a dotted attribute path)
nested = SimpleNamespace(inner=SimpleNamespace(tools=[double]))
# nothing at all: a valid app with no decide, no tools, no llm
empty = SimpleNamespace()

bad_tools_type = SimpleNamespace(tools="double")
bad_tool_value = SimpleNamespace(tools={"double": 42})
bad_tool_name = SimpleNamespace(tools={"no spaces allowed": double})
bad_decide = SimpleNamespace(decide="not a function")
bad_llm = SimpleNamespace(llm={"model": "x"})
bad_instructions = SimpleNamespace(instructions=["be terse"])

# this module, used as an app, exposes these:
tools = [double, shout, describe]
