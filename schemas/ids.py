"""Identifier rules shared by inputs, the dispatcher and the CLI."""

import re

# Producer-chosen session ids (docs/protocol.md, Inputs); ids the engine makes for sub-agents may reach 256.
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,256}$")
PRODUCER_SESSION_MAX = 128
# Message, interrupt and call ids named by clients and apps: same alphabet, bounded.
NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


# Ids the engine makes for sub-agents: the parent's id and `:sub-N` (up to 256 characters).
CHILD_SUFFIX_RE = re.compile(r":sub-\d+$")


#: A sub-agent call's timer in the deadlines index is `<call id>/timeout`: `/` is outside the
#: id alphabet, so no interrupt id (the index's other members) can take its name.
DEADLINE_SUFFIX = "/timeout"


def is_child_session(session: str) -> bool:
    """An id of the engine's sub-agent children (`<parent>:sub-<n>`): only the engine makes them."""
    return bool(CHILD_SUFFIX_RE.search(session))


def subagent_deadline(call_id: str) -> str:
    """The deadline timer of a sub-agent call."""
    return call_id + DEADLINE_SUFFIX


def call_of_deadline(timer: str) -> str | None:
    """The sub-agent call a deadline timer is for; None for an interrupt's deadline."""
    return timer.removesuffix(DEADLINE_SUFFIX) if timer.endswith(DEADLINE_SUFFIX) else None


def is_session_id(value: object, *, producer: bool = True) -> bool:
    if not isinstance(value, str) or not SESSION_ID_RE.fullmatch(value):
        return False
    return not producer or len(value) <= PRODUCER_SESSION_MAX or bool(CHILD_SUFFIX_RE.search(value))
