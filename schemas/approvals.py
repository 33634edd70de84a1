"""Approvals the engine enforces (docs/protocol.md, "Approvals"): a tool's `needs_approval`
declaration, the digest that binds an approval to one call's arguments, and the question the
engine asks. PURE: shared by the app loader, the dispatcher's core and the readers.

A tool declares it with a plain attribute, like its other marks, so an app needs no import
from Parley (the `parley.needs_approval` decorator sets the same attribute):

    pay.needs_approval = True                                  # anyone who may resume approves
    pay.needs_approval = {"approvers": ["alice", "bob"],       # only their signed resumes
                          "timeout_s": 3600,                   # unanswered: denied
                          "message": "Pay this invoice?",
                          "response_schema": {...}}            # the answer's JSON Schema
"""

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

#: the `reason` of every approval interrupt the engine raises: what apps and inboxes match on
APPROVAL_REASON = "approval"
#: what an approval's answer must be, unless the tool gives its own schema (which must require
#: the boolean `approved` too: the engine reads only that field)
DEFAULT_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"},
                   "message": {"type": "string", "maxLength": 2000}},
    "required": ["approved"],
    "additionalProperties": False,
}
#: what a deadline delivers: an approval nobody gave is a denial, never a default "yes"
TIMED_OUT_ANSWER: dict[str, Any] = {"approved": False}
#: the keys a `needs_approval` dict may have
POLICY_KEYS = frozenset({"approvers", "timeout_s", "message", "response_schema"})
#: the tool errors a call settles with when it is not approved (its `tool.completed` error)
DENIED = "approval_denied"
TIMED_OUT = "approval_timed_out"


class PolicyError(ValueError):
    """A `needs_approval` value the engine cannot enforce; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """One tool's declaration, checked: who may approve, how long the question stays open, what
    the approver is told and what an answer must look like."""

    #: principals whose signed resume may approve (None: any resume the producer edge accepts)
    approvers: tuple[str, ...] | None = None
    timeout_s: float | None = None
    message: str | None = None
    response_schema: dict[str, Any] | None = None

    @property
    def schema(self) -> dict[str, Any]:
        return self.response_schema if self.response_schema is not None else DEFAULT_RESPONSE_SCHEMA


def parse_policy(value: Any) -> ApprovalPolicy | None:
    """`fn.needs_approval` as a policy (None: the tool needs none). Raises PolicyError."""
    if value is None or value is False:
        return None
    if value is True:
        return ApprovalPolicy()
    if not isinstance(value, dict):
        raise PolicyError(f"must be True, False or a dict with keys {sorted(POLICY_KEYS)}, got {value!r}")
    unknown = sorted(set(value) - POLICY_KEYS)
    if unknown:
        raise PolicyError(f"has unknown keys {unknown}; the keys are {sorted(POLICY_KEYS)}")
    return ApprovalPolicy(approvers=_approvers(value.get("approvers")),
                          timeout_s=_timeout(value.get("timeout_s")),
                          message=_message(value.get("message")),
                          response_schema=_schema(value.get("response_schema")))


def _approvers(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value \
            or not all(isinstance(p, str) and p for p in value):
        raise PolicyError(f"key `approvers` must be a non-empty list of principal names, got {value!r}")
    return tuple(value)


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise PolicyError(f"key `timeout_s` must be a number of seconds > 0, got {value!r}")
    return float(value)


def _message(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 2000:
        raise PolicyError(f"key `message` must be a string of 1-2000 characters, got {value!r}")
    return value


def _schema(value: Any) -> dict[str, Any] | None:
    """The answer's schema must make `approved` a required boolean: that field alone decides,
    and an answer without it could not say yes or no. (Whether it is valid JSON Schema is
    checked where the validator lives: the dispatcher refuses to start with a bad one.)"""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PolicyError(f"key `response_schema` must be a JSON Schema object, got {value!r}")
    props = value.get("properties")
    approved = props.get("approved") if isinstance(props, dict) else None
    required = value.get("required")
    if value.get("type") != "object" or not isinstance(approved, dict) \
            or approved.get("type") != "boolean" or not isinstance(required, list) \
            or "approved" not in required:
        raise PolicyError("key `response_schema` must be an object schema whose `required` lists "
                          "`approved`, a property of type boolean")
    return value


F = TypeVar("F", bound=Callable[..., Any])


def needs_approval(fn: F | None = None, *, approvers: Sequence[str] | None = None,
                   timeout_s: float | None = None, message: str | None = None,
                   response_schema: dict[str, Any] | None = None) -> Any:
    """Mark a tool as needing approval: `@needs_approval` or `@needs_approval(approvers=[...])`.
    It sets `fn.needs_approval` (checked here, as the app loader checks it) and returns `fn`."""
    declared: Any = True
    options = {"approvers": list(approvers) if approvers is not None else None, "timeout_s": timeout_s,
               "message": message, "response_schema": response_schema}
    if any(v is not None for v in options.values()):
        declared = {k: v for k, v in options.items() if v is not None}
    parse_policy(declared)

    def mark(tool: F) -> F:
        tool.needs_approval = declared  # type: ignore[attr-defined]
        return tool

    return mark(fn) if fn is not None else mark


def call_digest(name: str, arguments: dict[str, Any] | None) -> str:
    """What an approval is bound to: SHA-256 of the call's tool name and arguments as canonical
    JSON (keys sorted, no spaces), `sha256:` and lowercase hex. The same call has the same
    digest in every process; other arguments, or another tool, have another."""
    canonical = orjson.dumps({"name": name, "arguments": arguments or {}}, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def question(call_id: str, name: str, arguments: dict[str, Any] | None, digest: str,
             policy: ApprovalPolicy) -> dict[str, Any]:
    """The approval interrupt's payload: what the approver sees and answers."""
    return {"message": policy.message or f"Run {name}?", "call_id": call_id, "tool": name,
            "arguments": arguments or {}, "digest": digest}


def answer_approves(payload: Any) -> bool:
    """Whether an answer (already checked against the schema) says yes."""
    return isinstance(payload, dict) and payload.get("approved") is True


def denial_error(payload: Any, timed_out: bool) -> str:
    """The tool error of a call that was not approved: the approver's message, when given, after
    the code, so the model reads why."""
    if timed_out:
        return TIMED_OUT
    message = payload.get("message") if isinstance(payload, dict) else None
    return f"{DENIED}: {message}" if isinstance(message, str) and message else DENIED
