"""`parley app check`: every problem an app has that Parley can see without running it.

`load_app` stops at the first problem, as a process must; the check reads the same attributes
with the same rules (workers/app.py `app_of`, and the dispatcher's parley/cli/appinfo.py), goes
on after each, and adds what would only show later (a tool schema that cannot be built, a
sub-agent that does not load, no model). It needs no Redis.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from parley.cli.appinfo import app_info
from parley.workers.app import (
    MCP_SERVER,
    MCP_TOOL,
    TOOL_DESCRIPTION,
    App,
    AppError,
    app_of,
    import_target,
    load_app,
    tool_schema,
)

Level = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Problem:
    level: Level
    message: str

    def line(self) -> str:
        return f"{self.level}: {self.message}"


@dataclass(frozen=True, slots=True)
class Checked:
    """What the check found: the app as loaded, less what was wrong (None: it did not import)."""

    app: App | None
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not any(p.level == "error" for p in self.problems)


def check_app(spec: str) -> Checked:
    """Every problem of the app `spec` names, errors (a process would not start) and warnings."""
    try:
        target = import_target(spec)
    except AppError as exc:
        return Checked(None, [Problem("error", str(exc))])
    errors: list[str] = []
    app = app_of(spec, target, errors)
    problems = [Problem("error", e) for e in errors]
    for name, fn in app.tools.items():
        problems.extend(_tool_problems(app, name, fn))
    problems.extend(_agent_problems(app))
    problems.extend(_warnings(app))
    return Checked(app, problems)


def _tool_problems(app: App, name: str, fn: Callable[..., Any]) -> list[Problem]:
    out: list[Problem] = []
    try:
        app_info(replace(app, tools={name: fn}))  # the dispatcher's own checks (an approval's schema)
    except AppError as exc:
        out.append(Problem("error", str(exc)))
    try:
        tool_schema(name, fn)
    except Exception as exc:  # a signature that cannot be read at all
        out.append(Problem("error", f"app {app.spec!r}: tool {name!r}: its schema cannot be built: {exc}"))
    if not getattr(fn, "deferred", False) and not (getattr(fn, TOOL_DESCRIPTION, None) or inspect.getdoc(fn)):
        out.append(Problem("warning", f"tool {name!r} has no docstring: the model is told nothing of "
                                      "what it does"))
    return out


def _agent_problems(app: App) -> list[Problem]:
    """Each sub-agent's app loads (workers load them all at start)."""
    out: list[Problem] = []
    for name, fn in app.tools.items():
        spec = getattr(fn, "agent", None)
        if spec is None:
            continue
        try:
            load_app(spec)
        except AppError as exc:
            out.append(Problem("error", f"tool {name!r}: its sub-agent does not load: {exc}"))
    return out


def _warnings(app: App) -> list[Problem]:
    out: list[Problem] = []
    if app.llm is None:
        out.append(Problem("warning", "no `llm`: every model call fails (`the app has no llm`), so a "
                                      "turn goes only as far as decide's own actions take it"))
    if app.decide_on is not None and app.decide is None:
        out.append(Problem("warning", "`decide_on` is set but there is no `decide`: it changes nothing"))
    return out


def summary(app: App) -> list[str]:
    """What the app is, said when the check found no error."""
    lines = [f"app {app.spec!r} loads"]
    on = f", on {', '.join(sorted(app.decide_on))}" if app.decide and app.decide_on else ""
    lines.append(f"  decide: {'yes' + on if app.decide else 'no (the proposed actions apply)'}")
    lines.append(f"  llm: {'yes' if app.llm else 'no'}")
    if app.instructions:
        lines.append(f"  instructions: {len(app.instructions)} characters")
    for name, tool in app_info(app).tools.items():
        kinds = [k for k in ("deferred", "idempotent") if getattr(tool, k)]
        server = getattr(app.tools[name], MCP_SERVER, None)
        if server is not None:
            kinds.append(f"from MCP server {server} ({getattr(app.tools[name], MCP_TOOL)!r})")
        if tool.agent:
            kinds.append(f"sub-agent {tool.agent}")
        if tool.timeout_s:
            kinds.append(f"time limit {tool.timeout_s:g} s")
        if tool.approval is not None:
            who = ", ".join(tool.approval.approvers) if tool.approval.approvers else "anyone"
            kinds.append(f"needs approval ({who})")
        lines.append(f"  tool {name}" + (f": {', '.join(kinds)}" if kinds else ""))
    return lines
