"""Identifier rules shared by inputs, the dispatcher and the CLI."""

import re

# Producer-chosen session ids (docs/protocol.md, Inputs); ids the engine makes for sub-agents may reach 256.
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:/-]{1,256}$")
# A session id's tenant: the name before its first `/` (`acme/s-42` is tenant `acme`'s). Key
# patterns of an ACL scope a login to one tenant (`parley:{acme/*}:*`), so a tenant's name holds
# no glob character, no colon and no brace.
TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
TENANT_SEP = "/"
PRODUCER_SESSION_MAX = 128
# Message, interrupt and call ids named by clients and apps: same alphabet, bounded.
NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


# Ids the engine makes for sub-agents: the parent's id and `:sub-N` (up to 256 characters).
CHILD_SUFFIX_RE = re.compile(r":sub-\d+$")


#: A sub-agent call's timer in the deadlines index is `<call id>/timeout`: `/` is outside the
#: id alphabet, so no interrupt id (the index's other members) can take its name.
DEADLINE_SUFFIX = "/timeout"


_CHILD_SUFFIXES_RE = re.compile(r"(?::sub-\d+)+$")


def root_session(session: str) -> str:
    """The root of a session id: a sub-agent's `<parent>:sub-<n>` (nested to any depth) is its
    top parent's id. Partitions are computed from it, so a family of sessions shares a
    partition, and a shard (schemas/shards.py)."""
    if ":sub-" not in session:  # most ids: no regex on the hot path (every submit and enqueue)
        return session
    return _CHILD_SUFFIXES_RE.sub("", session)


def is_child_session(session: str) -> bool:
    """An id of the engine's sub-agent children (`<parent>:sub-<n>`): only the engine makes them."""
    return bool(CHILD_SUFFIX_RE.search(session))


def subagent_deadline(call_id: str) -> str:
    """The deadline timer of a sub-agent call."""
    return call_id + DEADLINE_SUFFIX


def call_of_deadline(timer: str) -> str | None:
    """The sub-agent call a deadline timer is for; None for an interrupt's deadline."""
    return timer.removesuffix(DEADLINE_SUFFIX) if timer.endswith(DEADLINE_SUFFIX) else None


def tenant_of(session: str) -> str | None:
    """The tenant a session id belongs to, or None (an id without `/`)."""
    tenant, sep, _rest = session.partition(TENANT_SEP)
    return tenant if sep else None


def is_session_id(value: object, *, producer: bool = True) -> bool:
    if not isinstance(value, str) or not SESSION_ID_RE.fullmatch(value):
        return False
    tenant, sep, rest = value.partition(TENANT_SEP)
    if sep and not (TENANT_RE.fullmatch(tenant) and rest):  # `acme/` names no session of acme's
        return False
    return not producer or len(value) <= PRODUCER_SESSION_MAX or bool(CHILD_SUFFIX_RE.search(value))
