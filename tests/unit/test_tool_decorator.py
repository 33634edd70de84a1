"""`@parley.tool`: a tool's name, description and kind declared where it is defined, checked at
import, and read by the loader and the dispatcher exactly as the plain attributes are."""

import sys
import types
from typing import Any

import pytest

from parley import tool
from parley.cli.appinfo import app_info
from parley.dispatcher.core import ToolInfo
from parley.schemas.approvals import ApprovalPolicy
from parley.workers import awaiting
from parley.workers.app import AppError, load_app


def app_module(name: str, **attrs: Any) -> str:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return name


def test_bare_and_with_options_it_returns_the_function_itself():
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool(name="pay_invoice", description="Pay one invoice.", timeout_s=30, idempotent=True,
          needs_approval={"approvers": ["alice"], "message": "Pay?"})
    async def pay(to: str, amount: int) -> str:
        """Pay someone (the docstring the description replaces)."""
        return f"paid {amount} to {to}"

    assert add(2, 3) == 5 and awaiting.resolved(pay("acme", 5)) == "paid 5 to acme"
    app = load_app(app_module("tests_tool_decorator_app", tools=[add, pay]))
    assert list(app.tools) == ["add", "pay_invoice"]
    schemas = {s["name"]: s for s in app.tool_schemas()}
    assert schemas["pay_invoice"]["description"] == "Pay one invoice."
    assert schemas["pay_invoice"]["parameters"]["required"] == ["to", "amount"]
    assert schemas["add"]["description"] == "Add two numbers."
    info = app_info(app).tools
    assert info["add"] == ToolInfo()
    assert info["pay_invoice"] == ToolInfo(idempotent=True, timeout_s=30,
                                           approval=ApprovalPolicy(approvers=("alice",), message="Pay?"))


def test_the_decorator_and_the_plain_attributes_give_the_dispatcher_the_same_facts():
    def by_hand(x: str) -> str:
        """Look it up."""
        return x

    by_hand.deferred = True  # type: ignore[attr-defined]
    by_hand.needs_approval = True  # type: ignore[attr-defined]

    @tool(deferred=True, needs_approval=True)
    def decorated(x: str) -> str:
        """Look it up."""
        return x

    plain = app_info(load_app(app_module("tests_tool_plain", tools={"t": by_hand}))).tools["t"]
    marked = app_info(load_app(app_module("tests_tool_marked", tools={"t": decorated}))).tools["t"]
    assert plain == marked and plain.deferred and plain.approval is not None


@pytest.mark.parametrize("options, says", [
    ({"name": "bad name!"}, "name 'bad name!' is not a valid identifier"),
    ({"name": 5}, "name must be a string"),
    ({"description": ""}, "`description` must be a non-empty string"),
    ({"timeout_s": 0}, "`timeout_s` must be a number of seconds > 0"),
    ({"timeout_s": "30"}, "`timeout_s` must be a number of seconds > 0"),
    ({"idempotent": 1}, "`idempotent` must be True or False"),
    ({"deferred": "no"}, "`deferred` must be True or False"),
    ({"agent": ""}, "`agent` must be an app spec"),
    ({"needs_approval": {"approvers": "alice"}}, "`needs_approval`"),
    ({"needs_approval": {"surprise": 1}}, "`needs_approval`"),
])
def test_a_value_of_the_wrong_kind_fails_at_the_decorator(options: dict[str, Any], says: str):
    with pytest.raises(ValueError) as exc:
        @tool(**options)
        def t() -> None:
            """A tool."""
    assert says in str(exc.value) and "@tool on" in str(exc.value)


def test_a_dict_key_that_disagrees_with_the_name_and_two_tools_of_one_name_do_not_load():
    @tool(name="lookup")
    def find(q: str) -> str:
        """Find."""
        return q

    with pytest.raises(AppError, match="named 'lookup' by @tool"):
        load_app(app_module("tests_tool_disagree", tools={"search": find}))
    assert list(load_app(app_module("tests_tool_agree", tools={"lookup": find})).tools) == ["lookup"]

    def lookup(q: str) -> str:
        """Another."""
        return q

    with pytest.raises(AppError, match="two tools are named 'lookup'"):
        load_app(app_module("tests_tool_twice", tools=[find, lookup]))
