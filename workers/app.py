"""Load an app (`module` or `module:attr`) and describe its tools for the model.

An app is plain attributes: `decide`, `decide_on`, `tools`, `llm` (README, "An app"), and
`mcp_servers`, whose tools are listed as the app loads (docs/mcp.md). It needs no import from
Parley; tool kinds are plain function attributes (`fn.deferred = True`).
"""

import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import TypeAdapter

from parley.schemas.approvals import PolicyError, parse_policy
from parley.schemas.decision_errors import did_you_mean
from parley.schemas.triggers import TRIGGER_TYPES


class AppError(Exception):
    pass


@dataclass(frozen=True)
class App:
    spec: str
    decide: Callable[..., Any] | None = None
    decide_on: frozenset[str] | None = None
    tools: dict[str, Callable[..., Any]] = field(default_factory=dict)
    llm: Callable[[dict[str, Any]], Any] | None = None
    #: the system prompt: each model request carries it as `instructions`
    instructions: str | None = None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Built once per app: pydantic's schema generation cost more than a whole scripted
        LLM job. Each call returns its own copy, so an `llm` may change what it gets."""
        built = _SCHEMAS.get(id(self))
        if built is None or built[0] is not self:
            built = (self, orjson.dumps([tool_schema(name, fn) for name, fn in self.tools.items()]))
            _SCHEMAS[id(self)] = built
        schemas: list[dict[str, Any]] = orjson.loads(built[1])
        return schemas


# App is frozen (hashable by value would hash its callables): the cache is keyed by identity
# and keeps the app alive, which is right for the few apps a worker loads for its lifetime.
_SCHEMAS: dict[int, tuple[App, bytes]] = {}


def load_app(spec: str | None) -> App:
    """The app `spec` names (or $PARLEY_APP), checked: AppError at its first problem."""
    spec = spec or os.environ.get("PARLEY_APP")
    if not spec:
        raise AppError("no app given: pass --app module[:attr] or set PARLEY_APP")
    return app_of(spec, import_target(spec))


def import_target(spec: str) -> Any:
    """What `module[:attr]` names: the module, or the attribute of it."""
    # Like `python -m`, let an app in the working directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name is not None \
                and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            # the app itself is not found (not a module it imports): say where it was looked for
            hint = (f" (looked in the working directory {os.getcwd()} and on the Python path: run "
                    f"from the folder that holds {exc.name.replace('.', '/')}.py or its package, or "
                    "add that folder to PYTHONPATH)")
        raise AppError(f"cannot import app module {module_name!r}: {exc}{hint}") from exc
    for part in filter(None, attr.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AppError(f"app {spec!r}: {module_name} has no attribute {attr!r}") from None
    return target


def app_of(spec: str, target: Any, errors: list[str] | None = None) -> App:
    """The app made of `target`'s attributes, each checked. Without `errors`, the first problem
    raises AppError (a process must not start); with it, each problem is added there, the
    attribute (or the one tool) it concerns is left out, and the rest is still checked, so
    `parley app check` lists every problem in one run."""
    def checked(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except AppError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            return None

    decide = checked(lambda: _callable(spec, target, "decide"))
    llm = checked(lambda: _callable(spec, target, "llm"))
    instructions = checked(lambda: _instructions(spec, target))
    decide_on = checked(lambda: _decide_on(spec, getattr(target, "decide_on", None)))
    tools = checked(lambda: _tools(spec, getattr(target, "tools", None), errors)) or {}
    tools.update(checked(lambda: _mcp_tools(spec, getattr(target, "mcp_servers", None), tools, errors)) or {})
    return App(spec=spec, decide=decide, decide_on=decide_on, tools=tools, llm=llm,
               instructions=instructions or None)


def _callable(spec: str, target: Any, attr: str) -> Any:
    value = getattr(target, attr, None)
    if value is not None and not callable(value):
        raise AppError(f"app {spec!r}: `{attr}` is not callable")
    return value


def _instructions(spec: str, target: Any) -> str | None:
    instructions = getattr(target, "instructions", None)
    if instructions is not None and not isinstance(instructions, str):
        raise AppError(f"app {spec!r}: `instructions` must be a string (the system prompt), "
                       f"not {type(instructions).__name__}")
    return instructions


def _decide_on(spec: str, decide_on: Any) -> frozenset[str] | None:
    """The trigger types that run `decide`. A name that is no trigger type would match nothing,
    and the triggers the app meant to see would take their proposed actions unasked (an email
    sent without the confirmation), so it stops the app from loading."""
    if decide_on is None:
        return None
    if isinstance(decide_on, str) or not isinstance(decide_on, list | tuple | set | frozenset) \
            or not all(isinstance(t, str) for t in decide_on):
        raise AppError(f"app {spec!r}: `decide_on` must be a collection of trigger types, "
                       f"e.g. {{\"tool.execute\"}}")
    unknown = sorted(set(decide_on) - TRIGGER_TYPES)
    if unknown:
        names = ", ".join(_with_hint(t, TRIGGER_TYPES) for t in unknown)
        raise AppError(f"app {spec!r}: `decide_on` names unknown trigger types: {names}; "
                       f"the trigger types are: {', '.join(sorted(TRIGGER_TYPES))}")
    return frozenset(decide_on)


def _with_hint(name: str, valid: frozenset[str]) -> str:
    return repr(name) + did_you_mean(name, sorted(valid))


def _is_flag(value: Any) -> bool:
    return isinstance(value, bool)


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value > 0


def _is_spec(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


#: The attributes that mark a tool's kind (docs/protocol.md, Tools): the check each value must
#: pass, and what the error says it must be. The dispatcher trusts them once the app has loaded.
TOOL_MARKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "deferred": (_is_flag, "True or False"),
    "idempotent": (_is_flag, "True or False"),
    "timeout_s": (_is_seconds, "a number of seconds > 0"),
    "agent": (_is_spec, "an app spec `module[:attr]`"),
}


def _check_marks(spec: str, name: str, fn: Callable[..., Any]) -> None:
    for attr, (valid, what) in TOOL_MARKS.items():
        value = getattr(fn, attr, None)
        if value is not None and not valid(value):
            raise AppError(f"app {spec!r}: tool {name!r}: `{attr}` must be {what}, got {value!r}")
    try:
        parse_policy(getattr(fn, "needs_approval", None))
    except PolicyError as exc:
        raise AppError(f"app {spec!r}: tool {name!r}: `needs_approval` {exc}") from None


def load_agents(app: App) -> dict[str, App]:
    """Every sub-agent app reachable from `app` through tools' `fn.agent`, by spec (README,
    "Pauses, limits, sub-agents, signing").

    Workers run jobs only for these apps: a job payload naming any other app is refused, so
    the payload cannot make a worker import arbitrary modules.
    """
    found: dict[str, App] = {}
    todo = [app]
    while todo:
        current = todo.pop()
        for fn in current.tools.values():
            spec = getattr(fn, "agent", None)  # a non-empty string: checked when the app loaded
            if spec is None:
                continue
            if spec not in found:
                found[spec] = load_app(spec)
                todo.append(found[spec])
    return found


#: the attribute holding `@tool(name=...)`: the tool's name when `tools` is a list
TOOL_NAME = "tool_name"
#: the attribute holding `@tool(description=...)`: what the model is told instead of the
#: docstring's summary
TOOL_DESCRIPTION = "tool_description"
#: the attribute holding a tool's arguments as a JSON Schema, instead of one built from its
#: signature: an MCP server's tool has its server's inputSchema (docs/mcp.md)
TOOL_PARAMETERS = "tool_parameters"
#: the attributes of an MCP server's tool naming where it comes from: the server, and the
#: tool's name there
MCP_SERVER = "mcp_server"
MCP_TOOL = "mcp_tool"


def check_tool_name(name: Any) -> str | None:
    """What is wrong with a tool name (None: nothing): 1-64 characters of [A-Za-z0-9_.:-]."""
    if not isinstance(name, str):
        return f"must be a string, got {name!r}"
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
        return f"{name!r} is not a valid identifier (1-64 characters of A-Z a-z 0-9 _ . : -)"
    return None


def _tools(spec: str, tools: Any, errors: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    """The app's tools by name. With `errors` (see `app_of`), a bad tool is left out."""
    if tools is None:
        return {}
    items: Iterable[tuple[Any, Any]]
    if isinstance(tools, dict):
        items = tools.items()
    elif isinstance(tools, list | tuple):
        items = ((getattr(fn, TOOL_NAME, None) or getattr(fn, "__name__", repr(fn)), fn) for fn in tools)
    else:
        raise AppError(f"app {spec!r}: `tools` must be a dict or a list of functions")
    out: dict[str, Callable[..., Any]] = {}
    for name, fn in items:
        try:
            _check_tool(spec, name, fn, out)
        except AppError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        out[name] = fn
    return out


def _check_tool(spec: str, name: Any, fn: Any, seen: dict[str, Callable[..., Any]]) -> None:
    if not isinstance(name, str):
        raise AppError(f"app {spec!r}: tool names must be strings, got {name!r}")
    if not callable(fn):
        raise AppError(f"app {spec!r}: tool {name!r} is not callable")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
        raise AppError(f"app {spec!r}: tool name {name!r} is not a valid identifier")
    declared = getattr(fn, TOOL_NAME, None)
    if declared is not None and declared != name:
        # a dict's key and @tool(name=...) disagree: the model would be told one name and
        # the engine run another
        raise AppError(f"app {spec!r}: tool {name!r} is named {declared!r} by @tool(name=...): "
                       "use one name (or give `tools` as a list)")
    if name in seen:
        raise AppError(f"app {spec!r}: two tools are named {name!r}")
    _check_marks(spec, name, fn)


def _mcp_tools(spec: str, servers: Any, own: dict[str, Callable[..., Any]],
               errors: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    """The tools of the app's `mcp_servers`, each server listed now (docs/mcp.md). With `errors`
    (see `app_of`), a server that fails, or a tool whose name is taken, is left out."""
    if servers is None:
        return {}
    from parley.workers.mcp.servers import McpServer  # plain values: no MCP SDK

    if not isinstance(servers, list | tuple) or not all(isinstance(s, McpServer) for s in servers):
        raise AppError(f"app {spec!r}: `mcp_servers` must be a list of parley.mcp.stdio(...) and "
                       "parley.mcp.http(...)")
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise AppError(f"app {spec!r}: two MCP servers are named {', '.join(map(repr, twice))}")
    try:
        from parley.workers.mcp import connection, mapping, tools
    except ImportError as exc:
        raise AppError(f"app {spec!r}: `mcp_servers` needs the MCP SDK ({exc}): "
                       "pip install 'parley[mcp]'") from None

    def problem(message: str) -> None:
        if errors is None:
            raise AppError(f"app {spec!r}: {message}")
        errors.append(f"app {spec!r}: {message}")

    out: dict[str, Callable[..., Any]] = {}
    for server in servers:
        try:
            found = tools.app_tools(server)
        except (connection.McpServerError, mapping.ListingError) as exc:
            problem(str(exc))
            continue
        for name, fn in found.items():
            taken = "one of the app's own tools" if name in own else \
                f"a tool of MCP server {getattr(out[name], MCP_SERVER)!r}" if name in out else None
            if taken is not None:
                problem(f"{server.describe()}: its tool {getattr(fn, MCP_TOOL)!r} is named {name!r}, "
                        f"as {taken}: give the server another prefix=, or leave the tool out with "
                        "tools=[...]")
                continue
            out[name] = fn
    return out


def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph, and `name: text` lines of its Args section."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n", 1)[0].strip()
    args: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            m = re.match(r"^(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)$", stripped)
            if m:
                args[m.group(1)] = m.group(2)
            elif stripped and not line.startswith((" ", "\t")):
                in_args = False
    return summary, args


def tool_schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """`{name, description, parameters}` from the signature and docstring."""
    summary, arg_docs = _doc_parts(fn)
    summary = getattr(fn, TOOL_DESCRIPTION, None) or summary
    declared = getattr(fn, TOOL_PARAMETERS, None)
    if declared is not None:
        return {"name": name, "description": summary, "parameters": declared}
    properties: dict[str, Any] = {}
    required: list[str] = []
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError):  # annotations that do not resolve: describe what we can
        signature = inspect.signature(fn)
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
        try:
            schema = TypeAdapter(annotation).json_schema()
        except Exception:  # an annotation pydantic cannot describe: let the model send anything
            schema = {}
        schema.pop("title", None)
        if pname in arg_docs:
            schema["description"] = arg_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        properties[pname] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"name": name, "description": summary, "parameters": parameters}
