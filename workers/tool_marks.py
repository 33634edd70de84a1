"""`@parley.tool`: declare a tool's name, description and kind where it is defined.

It sets the plain attributes an app without imports sets by hand (`fn.deferred = True`,
`fn.needs_approval = {...}`; docs/protocol.md, "Tools") and checks each as the app loader
will, so that a mistake fails at import, in the line that made it. The function is returned
itself: still callable, `async def` too.
"""

from collections.abc import Callable
from typing import Any, TypeVar, overload

from parley.schemas.approvals import PolicyError, parse_policy
from parley.workers.app import TOOL_DESCRIPTION, TOOL_MARKS, TOOL_NAME, check_tool_name

F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(*, name: str | None = None, description: str | None = None, needs_approval: Any = None,
         timeout_s: float | None = None, idempotent: bool | None = None, deferred: bool | None = None,
         agent: str | None = None) -> Callable[[F], F]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         needs_approval: Any = None, timeout_s: float | None = None, idempotent: bool | None = None,
         deferred: bool | None = None, agent: str | None = None) -> Any:
    """Mark a function as a tool: `@tool`, or `@tool(name=..., description=..., needs_approval=True
    or {"approvers": [...], "timeout_s": ..., "message": ..., "response_schema": ...},
    timeout_s=..., idempotent=..., deferred=..., agent="module[:attr]")`.

    `name`: the tool's name for the model (default: the function's); `description`: what the
    model is told it does (default: the docstring's first paragraph; the arguments are still
    described from the signature and the docstring's Args). A value of the wrong kind raises
    ValueError here."""
    marks: dict[str, Any] = {"deferred": deferred, "idempotent": idempotent, "timeout_s": timeout_s,
                             "agent": agent}

    def mark(target: F) -> F:
        where = f"@tool on {getattr(target, '__qualname__', target)!r}"
        if name is not None:
            problem = check_tool_name(name)
            if problem is not None:
                raise ValueError(f"{where}: name {problem}")
        if description is not None and (not isinstance(description, str) or not description.strip()):
            raise ValueError(f"{where}: `description` must be a non-empty string, got {description!r}")
        for attr, value in marks.items():
            valid, what = TOOL_MARKS[attr]
            if value is not None and not valid(value):
                raise ValueError(f"{where}: `{attr}` must be {what}, got {value!r}")
        if needs_approval not in (None, False):
            try:
                parse_policy(needs_approval)
            except PolicyError as exc:
                raise ValueError(f"{where}: `needs_approval` {exc}") from None
        for attr, value in marks.items():
            if value is not None:
                setattr(target, attr, value)
        if needs_approval not in (None, False):
            target.needs_approval = needs_approval  # type: ignore[attr-defined]
        if name is not None:
            setattr(target, TOOL_NAME, name)
        if description is not None:
            setattr(target, TOOL_DESCRIPTION, description.strip())
        return target

    return mark(fn) if fn is not None else mark
