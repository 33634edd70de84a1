"""Budgets (I3): what a session may spend on model calls, tool calls and tokens.

Calls are counted before they start, so a decision that would go over the limit is not
applied at all: the engine raises a global `budget` interrupt instead, and the blocked
decision comes back as the resume's proposed actions. Tokens are known only after a
reply, so they stop what follows it. These are the queries; raising the stop is
`interrupts.raise_budget`.
"""

from typing import Any

from parley.dispatcher.core.transition import Tx
from parley.schemas.actions import Decision

BUDGET_KINDS = ("llm_calls", "tool_calls", "tokens")


def use(tx: Tx, kind: str, n: int = 1) -> None:
    tx.c.used[kind] = tx.c.used.get(kind, 0) + n


def tokens_spent(tx: Tx) -> bool:
    limit = (tx.c.budget or {}).get("tokens")
    return limit is not None and tx.c.used.get("tokens", 0) >= limit


def decision_exceeds(tx: Tx, decision: Decision, default_call: str | None) -> str | None:
    """The first limit the decision's work would exceed (or that is already spent), if any."""
    if not tx.c.budget:
        return None
    actions = [a.model_dump(exclude_unset=True) | {"type": a.type} for a in decision.actions]
    return actions_exceed(tx, actions, default_call)


def actions_exceed(tx: Tx, actions: list[dict[str, Any]], default_call: str | None) -> str | None:
    """`decision_exceeds` for actions in their wire form (a resume's proposed actions)."""
    limits = tx.c.budget or {}
    if not limits:
        return None
    wants = {"llm_calls": sum(a.get("type") == "llm.call" for a in actions),
             "tool_calls": sum(_would_run(tx, a, default_call) for a in actions)}
    for kind in ("llm_calls", "tool_calls"):
        limit = limits.get(kind)
        if limit is not None and wants[kind] and tx.c.used.get(kind, 0) + wants[kind] > limit:
            return kind
    limit = limits.get("tokens")
    if limit is not None and wants["llm_calls"] and tx.c.used.get("tokens", 0) >= limit:
        return "tokens"
    return None


def _would_run(tx: Tx, action: dict[str, Any], default_call: str | None) -> bool:
    """A tool.execute that will start a job (deferred and unknown tools spend no budget)."""
    if action.get("type") != "tool.execute":
        return False
    name = action.get("name")
    if name is None:
        w = tx.c.work.get(action.get("call_id") or default_call or "")
        name = w.name if w is not None else None
    tool = tx.app.tools.get(name or "")
    return tool is not None and not tool.deferred


def stop_payload(tx: Tx, exceeded: str) -> dict[str, Any]:
    """The payload of a budget interrupt: what was used, the limits, which one stopped it."""
    return {"used": {k: tx.c.used.get(k, 0) for k in BUDGET_KINDS},
            "limit": {k: (tx.c.budget or {}).get(k) for k in BUDGET_KINDS},
            "exceeded": exceeded}


def apply_new_limits(tx: Tx, payload: Any) -> None:
    """I3: a budget resume's `budget` replaces the limits it names (absolute values)."""
    if not (isinstance(payload, dict) and isinstance(payload.get("budget"), dict)):
        return
    tx.c.budget = {**(tx.c.budget or {}), **{
        k: v for k, v in payload["budget"].items()
        if k in BUDGET_KINDS and (v is None or (isinstance(v, int) and v >= 0))}}
