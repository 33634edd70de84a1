"""What the dispatcher is told of an app: its shape (decide_on, tool kinds), never its code."""

from typing import Any

from parley.dispatcher.core import AppInfo, ToolInfo
from parley.schemas import answers
from parley.schemas.approvals import TIMED_OUT_ANSWER, ApprovalPolicy, parse_policy
from parley.workers.app import App, AppError


def app_info(app: App) -> AppInfo:
    """Raises AppError for a declaration the dispatcher could not enforce."""
    return AppInfo(
        has_decide=app.decide is not None,
        decide_on=app.decide_on,
        tools={name: ToolInfo(deferred=bool(getattr(fn, "deferred", False)),
                              idempotent=bool(getattr(fn, "idempotent", False)),
                              agent=getattr(fn, "agent", None),
                              timeout_s=getattr(fn, "timeout_s", None),
                              approval=_approval(app.spec, name, fn))
               for name, fn in app.tools.items()},
    )


def _approval(spec: str, name: str, fn: Any) -> ApprovalPolicy | None:
    """The tool's `needs_approval`, its answer's schema checked as every interrupt's is (valid
    JSON Schema within the size limit), and, with a deadline, that the schema accepts the
    denial the deadline delivers, else the deadline could never settle the call. (The loader
    already checked the declaration's shape; a valid schema no answer can match is the app's
    to avoid, as for any interrupt.)"""
    policy = parse_policy(getattr(fn, "needs_approval", None))
    if policy is None or policy.response_schema is None:
        return policy
    where = f"app {spec!r}: tool {name!r}: `needs_approval` response_schema"
    problem = answers.schema_problem(policy.response_schema)
    if problem is not None:
        raise AppError(f"{where} {problem}")
    if policy.timeout_s is not None:
        wrong = answers.mismatch(policy.response_schema, TIMED_OUT_ANSWER)
        if wrong is not None:
            raise AppError(f"{where} must accept {TIMED_OUT_ANSWER}, what its deadline delivers: "
                           f"{wrong.message} at {wrong.path}")
    return policy
