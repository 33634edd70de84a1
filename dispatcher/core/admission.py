"""Admission limits (docs/protocol.md, "Limits"): what one session may hold, and the counts.

The submit function refuses an input over a limit before it is written; the dispatcher
checks the same limits again when it applies the input, for a producer that wrote its stream
directly. Both read the same values: the dispatcher publishes them in `parley:config` at start
and the commit keeps each session's counts in its meta hash (`n_msgs`, `n_branches`).

A *branch* is a leaf of the session's message tree: a message without children. So a new
root, or a message under a message that already has a child, makes one more branch; a
message under a leaf (a reply, the next message of a conversation) only moves that branch's
end. Only a client's `message.create` is refused at a limit: the engine's own messages (model
replies, tool results) always finish the turn in flight, so a session may end a little past
`messages` (never past `branches`: the engine only appends at a turn's tip, a leaf).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from parley.schemas.codec import DEFAULT_MAX_INPUT_BYTES

#: the defaults: far above what the seed scenario and the tests do, low enough that one
#: session cannot make its own loads (every transition reads its messages) slow for its partition
DEFAULT_INPUT_BYTES = DEFAULT_MAX_INPUT_BYTES
DEFAULT_PENDING = 100
DEFAULT_MESSAGES = 10_000
DEFAULT_BRANCHES = 1_000

#: `parley:config` fields the dispatcher writes them to, read by the submit function
CONFIG_FIELDS = {
    "input_bytes": "limit_input_bytes",
    "pending": "limit_pending",
    "messages": "limit_messages",
    "branches": "limit_branches",
}


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What a producer may put in: per entry, per session in flight, per session in all."""

    #: an entry's `input` field, in bytes (`too_large`)
    input_bytes: int = DEFAULT_INPUT_BYTES
    #: a producer's inputs of one session admitted and not yet applied (`rate_limited`, at
    #: submit only: once written, an input is applied)
    pending: int = DEFAULT_PENDING
    #: messages of one session (`session_full`)
    messages: int = DEFAULT_MESSAGES
    #: branches (leaves of the message tree) of one session (`session_full`)
    branches: int = DEFAULT_BRANCHES

    def __post_init__(self) -> None:
        for name in CONFIG_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"the {name} limit must be a whole number >= 1, not {value!r}")

    def config(self) -> dict[str, int]:
        """The `parley:config` fields and values that publish these limits."""
        return {field: getattr(self, name) for name, field in CONFIG_FIELDS.items()}


@dataclass(frozen=True, slots=True)
class Counts:
    """A session's message and branch counts (`n_msgs`, `n_branches` of its meta hash)."""

    messages: int = 0
    branches: int = 0


def count(messages: Iterable[dict[str, Any]]) -> Counts:
    """The counts of a whole set of messages (a session stored before counts were kept)."""
    n = 0
    parents: set[str] = set()
    for m in messages:
        n += 1
        if m.get("parent_id") is not None:
            parents.add(m["parent_id"])
    return Counts(messages=n, branches=n - len(parents))


def forks(parent: str | None, has_child: bool) -> bool:
    """Whether a new message under `parent` makes a new branch: a new root does, and so does
    a message under one that already has a child; under a leaf it only extends that branch."""
    return parent is None or has_child


def after(counts: Counts, parent: str | None, has_child: bool) -> Counts:
    """The counts once a message under `parent` is added."""
    return Counts(messages=counts.messages + 1,
                  branches=counts.branches + (1 if forks(parent, has_child) else 0))


def full(counts: Counts, limits: AdmissionLimits, parent: str | None, has_child: bool) -> str | None:
    """Why a client's message under `parent` would be over a limit (the `session_full`
    message), or None when it fits."""
    if counts.messages >= limits.messages:
        return (f"the session has {counts.messages} messages, the limit is {limits.messages}: "
                "start a new session")
    if forks(parent, has_child) and counts.branches >= limits.branches:
        return (f"the session has {counts.branches} branches, the limit is {limits.branches}: "
                "continue an existing branch (under its last message) or start a new session")
    return None
