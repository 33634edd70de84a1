"""Moving a partition between shards: what belongs to it, and the steps, as plain values.

Pure (no I/O): the shell that moves is parley/fleet/moves.py, whose docstring (and
docs/operations.md, "Moving a partition") gives the argument for why a move loses and
duplicates nothing. This module answers the questions the shell asks of every key and member
it meets: is this P's? which session is it of? and what is the plan: which tables to write,
in which order, and which shard to clean.

What a partition P owns on its shard:
- every key of its sessions (`Keys.session_keys`: `<prefix>:{S}:...`), a session being P's
  when its *root* id hashes to P (a sub-agent `S:sub-1` goes with `S`);
- its streams: `inputs:P`, `results:P`, and each registered producer's `in:<producer>:P`;
- its sessions' members of the shard-wide sets (`SHARED_SETS` below), the member naming the
  session in one of a few fixed forms (`MemberForm`);
- its share of the `stats` counters those sets feed (`held`, `parked`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from parley.schemas.ids import subagent_deadline
from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import ListingStatus, listing_member, metadata_pairs
from parley.schemas.shards import Placement
from parley.schemas.state import Core

SEP = "\x1f"  # the unit separator every shard-wide member uses between its parts

#: how long the move waits, by default, for P's queued and running jobs to finish (seconds)
DEFAULT_DRAIN_TIMEOUT_S = 60.0
#: the mover's own lease on the source (fencing): long enough to outlast any move; a crashed
#: mover's lease is removed by `parley partitions repair`
MOVER_LEASE_MS = 24 * 3600 * 1000
MOVER_TOKEN_PREFIX = "mover:"
#: `<prefix>:config` field on the target once every key of P is copied there: `repair` flips
#: a stopped move when it finds it, and the clean step deletes it last
COPIED_FIELD_PREFIX = "copied:"


def copied_field(partition: int) -> str:
    return f"{COPIED_FIELD_PREFIX}{partition}"


class MoveStep(StrEnum):
    """The steps of a move, in order (parley/fleet/moves.py)."""

    #: every shard's table says P is moving: nobody serves it, inputs are refused `moved`
    FREEZE = "freeze"
    #: the source's lease of P is taken by the mover: no stalled dispatcher can commit
    FENCE = "fence"
    #: P's queued and running jobs finish (or, at the timeout, are recorded lost)
    DRAIN = "drain"
    #: every key and member of P copied to the target
    COPY = "copy"
    #: every shard's table says P is on the target
    FLIP = "flip"
    #: P's keys and members deleted on the source
    CLEAN = "clean"


class MemberForm(StrEnum):
    """How a shard-wide set's member (or hash field) names its session."""

    #: the member is the session id (expiring, idle, pending:<producer>)
    SESSION = "session"
    #: `session US ...` (the interrupt index and details, deadlines, anchors, by-session)
    SESSION_FIRST = "session_first"
    #: `time US session [US ...]` (by-time, reason, principal, anyone, the listing's sets)
    SESSION_SECOND = "session_second"


class Holds(StrEnum):
    ZSET = "zset"
    HASH = "hash"


@dataclass(frozen=True, slots=True)
class SharedSet:
    """A shard-wide sorted set or hash holding members of many sessions: its key, or a SCAN
    pattern (`pattern`) naming a family of them (one per reason, producer, metadata pair)."""

    name: str
    holds: Holds
    form: MemberForm
    pattern: bool = False


def shared_sets(keys: Keys) -> list[SharedSet]:
    """Every shard-wide set a session has members in (schemas/keys.py), except the job records
    (`running`, `inflight` and its orders), which the drain empties of P's jobs before the copy."""
    z, h = Holds.ZSET, Holds.HASH
    first, second, whole = MemberForm.SESSION_FIRST, MemberForm.SESSION_SECOND, MemberForm.SESSION
    return [
        SharedSet(keys.interrupt_index, z, first),
        SharedSet(keys.interrupt_info, h, first),
        SharedSet(keys.interrupt_anchors, h, first),
        SharedSet(keys.deadlines, z, first),
        SharedSet(keys.interrupts_by_session, z, first),
        SharedSet(keys.interrupts_by_time, z, second),
        SharedSet(keys.interrupts_for_anyone, z, second),
        SharedSet(keys.interrupts_reason_prefix + "*", z, second, pattern=True),
        SharedSet(keys.interrupts_principal_prefix + "*", z, second, pattern=True),
        SharedSet(keys.expiring, z, whole),
        SharedSet(keys.idle, z, whole),
        SharedSet(keys.sessions_of_status("*"), z, second, pattern=True),
        SharedSet(keys.pending("*"), h, whole, pattern=True),
    ]


def session_of_member(form: MemberForm, member: str) -> str | None:
    """The session a member names (None: a member of no recognisable form, left alone)."""
    if form is MemberForm.SESSION:
        return member or None
    parts = member.split(SEP)
    if form is MemberForm.SESSION_FIRST:
        return parts[0] if len(parts) >= 2 and parts[0] else None
    return parts[1] if len(parts) >= 2 and parts[1] else None


def in_partition(session: str, partition: int, partitions: int) -> bool:
    """The session (or sub-agent: by its root) is P's."""
    return partition_of(session, partitions) == partition


def session_key_pattern(keys: Keys) -> str:
    """SCAN pattern of every session's keys (`<prefix>:{S}:...`; braces are literal in globs)."""
    return f"{keys.prefix}:{{*}}:*"


def session_of_key(keys: Keys, key: str) -> str | None:
    """The session a per-session key belongs to (None: not a session key of this prefix)."""
    head = f"{keys.prefix}:{{"
    if not key.startswith(head):
        return None
    session, sep, rest = key[len(head):].partition("}:")
    if not sep or not session or not rest or session in ("*",):
        return None
    return session if key in keys.session_keys(session) else None


def partition_streams(keys: Keys, partition: int, partitions: int, producers: Iterable[str]) -> list[str]:
    """P's streams: its inputs, its results, each registered producer's input stream of P."""
    out = [keys.inputs(partition, partitions), keys.results(partition, partitions)]
    out += [keys.producer_inputs(name, partition, partitions) for name in sorted(producers)]
    return out


def session_of_job(raw: str | bytes) -> str | None:
    """The session of a `running` or `inflight` record (JSON), None if it does not read."""
    try:
        rec: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    session = rec.get("session") if isinstance(rec, dict) else None
    return session if isinstance(session, str) else None


def held_of(core: dict[str, Any] | None, outbox: Iterable[dict[str, Any]]) -> int:
    """The session's share of the `held` counter: held decisions in its core, less the `held`
    deltas its outbox has not flushed yet (they are added by whichever shard flushes them)."""
    held = 0
    if core:
        held = sum(len(turn.get("held") or []) for turn in (core.get("turns") or {}).values())
    pending = sum(int(fx.get("delta", 0)) for fx in outbox
                  if fx.get("op") == "stat" and fx.get("field") == "held")
    return held - pending


def parked_of(anchor_counts: Iterable[int]) -> int:
    """The sessions' share of the `parked` counter: one per anchor with an open interrupt."""
    return sum(1 for n in anchor_counts if n > 0)


@dataclass(frozen=True, slots=True)
class MovePlan:
    """One move: P from `source` to `target`, and the tables written on the way."""

    partition: int
    source: int
    target: int
    frozen: Placement
    flipped: Placement

    def write_order(self) -> list[int]:
        """Shards in the order a table is written: target first, source last, so that a
        process that finds the new table on the source finds it everywhere."""
        others = [s for s in range(self.frozen.shards) if s not in (self.source, self.target)]
        return [self.target, *others, self.source]


def plan_move(placement: Placement, partition: int, to: int) -> MovePlan:
    """The plan, or PlacementError saying why P cannot move to `to` (no such partition or
    shard, already there, already moving)."""
    frozen = placement.freeze(partition, to)
    return MovePlan(partition, placement.shard_of(partition), to, frozen, frozen.flip(partition))


class Repair(StrEnum):
    """What `parley partitions repair` does about one partition."""

    #: the move copied everything: flip the table and clean the source
    FLIP = "flip"
    #: the move stopped before its copy was done: serve P on its source again
    UNFREEZE = "unfreeze"
    #: the table flipped but the source was not cleaned: clean it
    CLEAN = "clean"


@dataclass(frozen=True, slots=True)
class RepairStep:
    partition: int
    action: Repair
    source: int
    target: int


def plan_repair(placement: Placement, copied: dict[int, int]) -> list[RepairStep]:
    """What to do with the newest table and the `copied:<P>` marks found (partition -> the
    shard holding the mark): a moving P whose target holds the mark is flipped, any other
    moving P unfrozen; a P not moving whose mark is on its own shard was flipped but not
    cleaned (every shard but the mark's is cleaned of it)."""
    steps: list[RepairStep] = []
    for p, to in sorted(placement.moving.items()):
        action = Repair.FLIP if copied.get(p) == to else Repair.UNFREEZE
        steps.append(RepairStep(p, action, placement.shard_of(p), to))
    for p, on in sorted(copied.items()):
        if p not in placement.moving and placement.shard_of(p) == on:
            steps.append(RepairStep(p, Repair.CLEAN, -1, on))
    return steps


def partition_states(placement: Placement) -> list[tuple[int, int, str]]:
    """(partition, shard, state) for `parley partitions list`: `served`, or `moving to <t>`."""
    out = []
    for p in range(placement.partitions):
        to = placement.moving.get(p)
        out.append((p, placement.shard_of(p), "served" if to is None else f"moving to {to}"))
    return out



# ---- a partition's members found by its sessions, not by scanning the shard --------------------

#: `<prefix>:config` field, "1" once every session of the shard is in its partition's list of
#: sessions (`Keys.partition_sessions`): a move then finds P's keys and members from that list,
#: in O(P's sessions); without it (a shard of an older release, before `parley partitions
#: index`), by scanning the shard as before
INDEXED_FIELD = "partition_sessions"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A member a session may have in a shard-wide set: looked up exactly (ZSCORE or HGET), and
    copied when it is there."""

    key: str
    holds: Holds
    member: str


def by_session_range(session: str) -> tuple[str, str]:
    """The ZRANGE BYLEX bounds of a session's members of the by-session set (`session US time US
    id`): from `session US` up to, not including, `session` followed by the next byte."""
    return f"[{session}{SEP}", f"({session}\x20"


def interrupt_of_by_session(member: str) -> tuple[str, str] | None:
    """(raise time as 15 digits, interrupt id) of a by-session member, None if it does not read."""
    parts = member.split(SEP)
    return (parts[1], parts[2]) if len(parts) == 3 and parts[1] and parts[2] else None


def session_candidates(keys: Keys, session: str, core: Core | None) -> list[Candidate]:
    """The members a session's own record names (or may name: a status or a timer whose change
    is still in the outbox): expiring, idle, its place in each status's list and in each of its
    metadata pairs' lists, and the deadline timer of each sub-agent call it waits on."""
    z = Holds.ZSET
    out = [Candidate(keys.expiring, z, session), Candidate(keys.idle, z, session)]
    if core is None:
        return out
    member = listing_member(core.created_at, session)
    # every status, not only the core's: a change of status committed but not yet flushed
    # (its Listing effect in the outbox) leaves the old one in the shard's sets
    out += [Candidate(keys.sessions_of_status(status), z, member) for status in ListingStatus]
    out += [Candidate(keys.sessions_of_metadata(k, v), z, member) for k, v in metadata_pairs(core.metadata)]
    out += [Candidate(keys.deadlines, z, Keys.index_member(session, subagent_deadline(w.id)))
            for w in core.work.values() if w.deadline is not None]
    return out


def interrupts_of(core: Core | None, by_session: Iterable[str]) -> dict[str, str]:
    """A session's open interrupts: id -> raise time as the index writes it (15 digits), from
    its by-session members and from its core (an interrupt the index has not listed yet)."""
    out: dict[str, str] = {}
    for member in by_session:
        found = interrupt_of_by_session(member)
        if found is not None:
            out[found[1]] = found[0]
    for interrupt in (core.interrupts.values() if core is not None else ()):
        out.setdefault(interrupt.id, lua_time(interrupt.raised_at))
    return out


def lua_time(ms: float) -> str:
    """A raise time as index_lib.lua writes it (`%015.0f`: rounded to the millisecond)."""
    return f"{round(ms):015d}"


def interrupt_candidates(keys: Keys, session: str, interrupt_id: str, raised: str) -> list[Candidate]:
    """An open interrupt's members that its id and raise time name (index_lib.lua, index_add.lua):
    the index, its details, the deadlines and the by-session set."""
    z, h = Holds.ZSET, Holds.HASH
    member = f"{session}{SEP}{interrupt_id}"
    return [Candidate(keys.interrupt_index, z, member), Candidate(keys.interrupt_info, h, member),
            Candidate(keys.deadlines, z, member),
            Candidate(keys.interrupts_by_session, z, f"{session}{SEP}{raised}{SEP}{interrupt_id}")]


def listed_candidates(keys: Keys, info: dict[str, Any], raised: str) -> list[Candidate]:
    """The members an open interrupt's details name (index_lib.lua `index_entries`, with the
    raise time `raised` as the by-session member holds it, and its anchor in the anchors hash):
    by time, by reason, by each principal that may answer (or "anyone"). The anchor needs only
    the session; the rest is skipped for details that do not read."""
    session, interrupt_id, reason = info.get("session"), info.get("interrupt_id"), info.get("reason")
    if not isinstance(session, str):
        return []
    z, h = Holds.ZSET, Holds.HASH
    anchor = info.get("anchor")
    anchored = anchor if isinstance(anchor, str) else ""  # a global interrupt: its session's ''
    out = [Candidate(keys.interrupt_anchors, h, f"{session}{SEP}{anchored}")]
    if not (isinstance(interrupt_id, str) and isinstance(reason, str)):
        return out
    timed = f"{raised}{SEP}{session}{SEP}{interrupt_id}"
    out += [Candidate(keys.interrupts_by_time, z, timed),
            Candidate(keys.interrupts_of_reason(reason), z, timed)]
    who = info.get("resumable_by")
    if isinstance(who, list):
        out += [Candidate(keys.interrupts_of_principal(p), z, timed) for p in who if isinstance(p, str)]
    elif who is None:  # anyone (any other value, cjson's empty list `{}` among them: nobody)
        out.append(Candidate(keys.interrupts_for_anyone, z, timed))
    return out
