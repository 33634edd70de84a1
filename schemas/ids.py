"""Identifier rules shared by inputs, the dispatcher and the CLI."""

import re

# Producer-chosen session ids (docs/protocol.md, Inputs); ids the engine makes for sub-agents may reach 256.
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,256}$")
PRODUCER_SESSION_MAX = 128
# Message, interrupt and call ids named by clients and apps: same alphabet, bounded.
NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


# Ids the engine makes for sub-agents: the parent's id and `:sub-N` (up to 256 characters).
CHILD_SUFFIX_RE = re.compile(r":sub-\d+$")


def is_session_id(value: object, *, producer: bool = True) -> bool:
    if not isinstance(value, str) or not SESSION_ID_RE.fullmatch(value):
        return False
    return not producer or len(value) <= PRODUCER_SESSION_MAX or bool(CHILD_SUFFIX_RE.search(value))
