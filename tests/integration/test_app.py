"""workers.app (README.md, An app; docs/protocol.md, Model calls and Tools): loading an app by
`module` or `module:attr`, its errors, tool schemas."""

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from parley.cli import cli
from parley.cli.appinfo import app_info
from parley.workers.app import App, AppError, load_app, tool_schema
from tests.apps import integration_apps as apps
from tests.apps import scenarios

MOD = "tests.apps.integration_apps"


def test_load_a_module() -> None:
    app = load_app("tests.apps.scenarios")
    assert isinstance(app, App)
    assert app.spec == "tests.apps.scenarios"
    assert app.decide is scenarios.decide
    assert app.llm is scenarios.llm
    assert app.decide_on is None  # no decide_on: every trigger runs decide
    assert list(app.tools) == [fn.__name__ for fn in scenarios.tools]  # a list: names from functions
    assert {"send_email", "add", "later"} <= set(app.tools)
    assert app.tools["add"] is scenarios.add
    info = app_info(app)
    assert info.has_decide is True
    assert info.tools["later"].deferred is True and info.tools["add"].deferred is False


def test_load_module_attr_with_a_tools_dict() -> None:
    app = load_app(f"{MOD}:bundle")
    assert app.spec == f"{MOD}:bundle"
    assert app.tools == {"twice": apps.double, "loud": apps.shout}  # dict keys are the names
    assert app.decide is apps.my_decide and app.llm is apps.my_llm
    assert app.decide_on == frozenset({"tool.execute", "message.created"})
    info = app_info(app)
    assert info.needs_decide("tool.execute") and not info.needs_decide("llm.completed")


def test_load_a_dotted_attribute_and_a_bare_namespace() -> None:
    assert list(load_app(f"{MOD}:nested.inner").tools) == ["double"]
    empty = load_app(f"{MOD}:empty")
    assert (empty.decide, empty.decide_on, empty.tools, empty.llm) == (None, None, {}, None)
    assert app_info(empty).has_decide is False


def test_module_app_takes_tool_names_from_function_names() -> None:
    app = load_app(MOD)
    assert list(app.tools) == ["double", "shout", "describe"]
    assert app.decide is None and app.llm is None  # module-level `my_decide` is not `decide`
    assert [s["name"] for s in app.tool_schemas()] == ["double", "shout", "describe"]


def test_app_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_APP", f"{MOD}:bundle")
    assert load_app(None).spec == f"{MOD}:bundle"
    assert load_app("").spec == f"{MOD}:bundle"
    monkeypatch.delenv("PARLEY_APP")
    with pytest.raises(AppError, match=r"no app given: pass --app module\[:attr\] or set PARLEY_APP"):
        load_app(None)


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_for_parley", "cannot import app module 'no_such_module_for_parley'"),
    ("tests.apps.no_such_app:x", "cannot import app module 'tests.apps.no_such_app'"),
    (f"{MOD}:missing", f"app '{MOD}:missing': {MOD} has no attribute 'missing'"),
    (f"{MOD}:nested.nope", "has no attribute 'nested.nope'"),
    (f"{MOD}:bad_tools_type", "`tools` must be a dict or a list of functions"),
    (f"{MOD}:bad_tool_value", "tool 'double' is not callable"),
    (f"{MOD}:bad_tool_name", "tool name 'no spaces allowed' is not a valid identifier"),
    (f"{MOD}:bad_decide", f"app '{MOD}:bad_decide': `decide` is not callable"),
    (f"{MOD}:bad_llm", "`llm` is not callable"),
    (f"{MOD}:bad_instructions", "`instructions` must be a string (the system prompt), not list"),
])
def test_load_errors_are_app_errors_with_clear_messages(spec: str, message: str) -> None:
    with pytest.raises(AppError) as info:
        load_app(spec)
    assert message in str(info.value)


def test_an_app_not_found_says_where_it_was_looked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: a wrong --app from another folder said only `No module named 'myapp'`. A module
    the app itself imports that is missing is reported as it is, without the hint."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AppError) as info:
        load_app("myapp_not_here")
    said = str(info.value)
    assert f"looked in the working directory {tmp_path}" in said and "myapp_not_here.py" in said
    (tmp_path / "app_with_a_missing_import.py").write_text("import no_such_dependency_for_parley\n")
    with pytest.raises(AppError) as info:
        load_app("app_with_a_missing_import")
    assert "No module named 'no_such_dependency_for_parley'" in str(info.value)
    assert "looked in the working directory" not in str(info.value)


def test_tool_schema_from_signature_and_docstring() -> None:
    schema = tool_schema("describe", apps.describe)
    assert schema == {
        "name": "describe",
        "description": "Describe a delivery.",  # the first paragraph only
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "the recipient address"},
                "count": {"type": "integer", "description": "how many to send"},
                "ratio": {"type": "number"},
                "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                "mode": {"enum": ["fast", "slow"], "type": "string", "description": "fast or slow"},
                "urgent": {"type": "boolean"},
            },
            "required": ["to", "count"],  # *extra and **options are not parameters
        },
    }


def test_tool_schema_without_annotations_or_docstring() -> None:
    assert tool_schema("untyped", apps.untyped) == {
        "name": "untyped", "description": "",
        "parameters": {"type": "object", "properties": {"thing": {}, "other": {}},
                       "required": ["thing"]}}


def test_tool_schema_of_a_function_with_no_parameters_has_no_required() -> None:
    def ping() -> str:
        """Ping."""
        return "pong"

    assert tool_schema("ping", ping) == {"name": "ping", "description": "Ping.",
                                         "parameters": {"type": "object", "properties": {}}}


def test_app_tool_schemas_are_what_the_model_is_given() -> None:
    schemas = {s["name"]: s for s in load_app("tests.apps.scenarios").tool_schemas()}
    assert schemas["send_email"] == {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"},
                                                        "body": {"type": "string"}},
                       "required": ["to", "body"]}}
    assert schemas["add"]["parameters"]["properties"] == {"a": {"type": "integer"},
                                                          "b": {"type": "integer"}}
    assert schemas["slow"]["parameters"]["properties"] == {"seconds": {"type": "number"}}


# ---- what an app declares is checked when it loads, in the dispatcher and the worker alike ------


def _app_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> str:
    """A throwaway app module, importable by name for the length of one test."""
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def _tool(**marks: Any) -> Callable[..., str]:
    def send(to: str) -> str:
        """Send."""
        return to

    send.__dict__.update(marks)
    return send


def _decide(trigger: Any, proposed: Any) -> Any:
    return proposed


def test_a_decide_on_typo_is_a_load_error_naming_the_trigger_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """`decide_on = {"tool.exec"}` used to load silently: no trigger matched it, so the seed app's
    confirmation was skipped and the email sent without asking."""
    spec = _app_module(monkeypatch, "parley_app_typo", decide=_decide,
                       decide_on={"tool.exec", "message.created"})
    with pytest.raises(AppError) as info:
        load_app(spec)
    message = str(info.value)
    assert "`decide_on` names unknown trigger types: 'tool.exec' (did you mean 'tool.execute'?)" in message
    assert "the trigger types are: interrupt.resumed, llm.completed, llm.failed, message.created, " \
           "session.created, tool.completed, tool.execute" in message


@pytest.mark.parametrize(("marks", "message"), [
    ({"timeout_s": "30"}, "tool 'send': `timeout_s` must be a number of seconds > 0, got '30'"),
    ({"timeout_s": 0}, "tool 'send': `timeout_s` must be a number of seconds > 0, got 0"),
    ({"timeout_s": True}, "tool 'send': `timeout_s` must be a number of seconds > 0, got True"),
    ({"timeout_s": float("nan")}, "tool 'send': `timeout_s` must be a number of seconds > 0, got nan"),
    ({"deferred": "no"}, "tool 'send': `deferred` must be True or False, got 'no'"),
    ({"idempotent": 1}, "tool 'send': `idempotent` must be True or False, got 1"),
    ({"agent": 3}, "tool 'send': `agent` must be an app spec `module[:attr]`, got 3"),
    ({"agent": ""}, "tool 'send': `agent` must be an app spec `module[:attr]`, got ''"),
])
def test_a_tool_attribute_of_the_wrong_type_is_a_load_error(
        monkeypatch: pytest.MonkeyPatch, marks: dict[str, Any], message: str) -> None:
    """docs/protocol.md, Tools: `fn.deferred = "no"` used to read as deferred (any truthy
    value), and `fn.timeout_s = "30"` reached the job's time limit as text."""
    spec = _app_module(monkeypatch, "parley_app_marks", tools=[_tool(**marks)])
    with pytest.raises(AppError) as info:
        load_app(spec)
    assert message in str(info.value)


def test_well_typed_tool_attributes_load() -> None:
    info = app_info(App("x", tools={"t": _tool(timeout_s=2.5, idempotent=True, deferred=False)}))
    assert info.tools["t"].timeout_s == 2.5 and info.tools["t"].idempotent is True


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_dispatcher_and_worker_refuse_to_start_with_a_bad_app(
        monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    spec = _app_module(monkeypatch, "parley_app_start", decide=_decide, decide_on=["tool.exec"])
    # an unreachable Redis: the app is checked before anything connects
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", command, "--app", spec])
    assert result.exit_code == 1
    assert "`decide_on` names unknown trigger types: 'tool.exec'" in result.output


@pytest.mark.parametrize(("declared", "message"), [
    ("yes", "tool 'send': `needs_approval` must be True, False or a dict"),
    ({"approvers": "alice"}, "tool 'send': `needs_approval` key `approvers` must be a non-empty list"),
    ({"who": ["alice"]}, "tool 'send': `needs_approval` has unknown keys ['who']"),
])
def test_a_needs_approval_the_engine_could_not_enforce_is_a_load_error(
        monkeypatch: pytest.MonkeyPatch, declared: Any, message: str) -> None:
    spec = _app_module(monkeypatch, "parley_app_approval", tools=[_tool(needs_approval=declared)])
    with pytest.raises(AppError) as info:
        load_app(spec)
    assert message in str(info.value)


NOTE_SCHEMA = {"type": "object", "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
               "required": ["approved", "note"]}


@pytest.mark.parametrize(("declared", "message"), [
    ({"response_schema": {"type": "object", "properties": {"approved": {"type": "boolean"}},
                          "required": ["approved"], "minProperties": "one"}},
     "`needs_approval` response_schema is not valid JSON Schema"),
    ({"response_schema": NOTE_SCHEMA, "timeout_s": 60},
     "must accept {'approved': False}, what its deadline delivers"),
])
def test_the_dispatcher_checks_an_approvals_answer_schema_as_every_interrupts(
        declared: dict[str, Any], message: str) -> None:
    """A schema no answer could match, or one the deadline's denial fails, would leave the call
    waiting for good: the dispatcher's view of the app refuses it."""
    with pytest.raises(AppError) as info:
        app_info(App("x", tools={"t": _tool(needs_approval=declared)}))
    assert message in str(info.value)


def test_a_well_formed_needs_approval_reaches_the_dispatcher_as_a_policy() -> None:
    info = app_info(App("x", tools={"t": _tool(needs_approval={"approvers": ["alice"], "response_schema":
                                                                NOTE_SCHEMA})}))
    policy = info.tools["t"].approval
    assert policy is not None and policy.approvers == ("alice",) and policy.schema == NOTE_SCHEMA
    assert app_info(App("x", tools={"t": _tool()})).tools["t"].approval is None


def test_a_dispatcher_whose_approvers_could_never_sign_does_not_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Approvers answer with signed resumes: without a keys file none could, and the gated tool
    could never run. The dispatcher says so before it connects anywhere."""
    gated = _tool(needs_approval={"approvers": ["alice"]})
    spec = _app_module(monkeypatch, "parley_app_approvers", tools=[gated])
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", "dispatcher", "--app", spec])
    assert result.exit_code == 1
    assert "name approvers (alice), whose resumes must be signed: start the dispatcher with --keys-file" \
        in result.output
