"""Answering several questions with one form (pure): which questions were picked, and whether
they can share one answer.

The list's rows carry a checkbox whose value names the question (`pick_of`: the session and the
interrupt id as a cursor-like token, so a session id may hold any character). One form answers
the picked questions only when they ask for the same kind of answer: the same `response_schema`
(compared as canonical JSON), or none at all (Approve / Decline). Picked questions that differ
are offered as groups, each answered on its own; those the person may not answer, or that are no
longer open, are set aside with the reason, and the rest go on.
"""

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from parley.client.inbox import OpenInterrupt, decode_token, encode_token

#: questions one form may answer at once (each is a resume of its own, sent concurrently)
MAX_PICKS = 50


class BulkError(ValueError):
    """Picks the page cannot use; the message says why."""


@dataclass(frozen=True, slots=True)
class Pick:
    session: str
    interrupt_id: str


def pick_of(row: OpenInterrupt) -> str:
    """A row's checkbox value."""
    return token_of(Pick(row.session, row.interrupt_id))


def token_of(pick: Pick) -> str:
    return encode_token([pick.session, pick.interrupt_id])


def read_picks(values: Iterable[str]) -> list[Pick]:
    """The picked questions, in order, each once; BulkError when none, too many, or one is not a
    pick the list made."""
    # a dict keeps the order and finds a repeat at once; the limit is checked as picks come,
    # so a form of 2,000 fields costs no more than one of 51
    picks: dict[Pick, None] = {}
    for value in values:
        try:
            session, interrupt_id = decode_token(value)
        except (ValueError, TypeError):
            raise BulkError(_NOT_OFFERED) from None
        if not (isinstance(session, str) and isinstance(interrupt_id, str) and session and interrupt_id):
            raise BulkError(_NOT_OFFERED)
        picks[Pick(session, interrupt_id)] = None
        if len(picks) > MAX_PICKS:
            raise BulkError(f"at most {MAX_PICKS} questions can be answered at once")
    if not picks:
        raise BulkError("no question is selected: tick the questions to answer together in the list")
    return list(picks)


_NOT_OFFERED = "a selected question is not one the list offered: go back to the list and select again"


def schema_key(schema: dict[str, Any] | None) -> bytes:
    """Two questions take the same answer form when these are equal."""
    return b"null" if schema is None else orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


@dataclass(frozen=True)
class SetAside:
    pick: Pick
    #: the question, when it is still open
    row: OpenInterrupt | None
    why: str


@dataclass(frozen=True)
class Selection:
    #: the questions one form answers (all of one schema), when `groups` has one group
    groups: list[list[OpenInterrupt]] = field(default_factory=list)
    set_aside: list[SetAside] = field(default_factory=list)

    @property
    def rows(self) -> list[OpenInterrupt]:
        """The questions of the one form (empty when there are several groups, or none)."""
        return self.groups[0] if len(self.groups) == 1 else []

    @property
    def schema(self) -> dict[str, Any] | None:
        return self.rows[0].response_schema if self.rows else None


def select(picks: Sequence[Pick], rows: Sequence[OpenInterrupt | None],
           may_answer: Callable[[OpenInterrupt], bool]) -> Selection:
    """The picked questions (`rows[i]` is `picks[i]`'s, None when not open) grouped by the answer
    they take, in the order picked, with the ones that cannot be answered set aside."""
    groups: dict[bytes, list[OpenInterrupt]] = {}
    aside: list[SetAside] = []
    for pick, row in zip(picks, rows, strict=True):
        if row is None:
            aside.append(SetAside(pick, None, "no longer open: answered, past its deadline, or closed"))
        elif not may_answer(row):
            aside.append(SetAside(pick, row, "you may not answer it"))
        else:
            groups.setdefault(schema_key(row.response_schema), []).append(row)
    return Selection(list(groups.values()), aside)


def idempotency_key(answer_id: str, pick: Pick) -> str:
    """One answer of a bulk form: the form's one-time id and the question, so a form sent twice
    sends each of its answers once, and no two questions share a key."""
    digest = hashlib.sha256(orjson.dumps([pick.session, pick.interrupt_id])).hexdigest()
    return f"inbox-{answer_id}-{digest[:16]}"
