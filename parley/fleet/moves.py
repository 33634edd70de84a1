"""Moving a partition from one shard to another while the deployment runs: the move's steps.

The shell over schemas/moves.py (which says what belongs to a partition P). A move of P from
its source shard to a target shard goes in six steps; together they lose no input, apply none
twice, and lose no work outcome:

1. Freeze: `placement.freeze(P, to)` is written on every shard, the target first and the
   source last. From then no shard serves P: the source's dispatchers give P's lease back
   within one lease-maintenance tick and do not take it again, the source's sweeps skip P's
   sessions, and the submit function refuses P's inputs with `moved` (clients read the table
   again and retry until the flip, so an input is either on the source before the freeze or
   on the target after the flip, never both).
2. Fence: once the source's `lease:P` is gone, the mover SETs it itself (NX, a long PX, a
   `mover:` token). Every commit script checks its caller's lease token, so a dispatcher that
   stalled holding P can no longer write P's sessions: nothing changes them behind the copy.
3. Drain: wait (`--drain-timeout`, default 60 s) until no job of a P session is queued,
   running or in flight on the source: the outcomes are then in P's results stream, which
   travels. Jobs still there at the timeout are taken off their queue and recorded lost on
   P's results stream, as the lost-work sweeps would: the target's dispatcher retries them by
   the engine's rules (decide, LLM and idempotent tool jobs again; other tools settle as
   `worker_lost`); a late outcome of one still running is dropped (it is of an old attempt).
4. Copy: every key of P's sessions, P's streams (inputs, results, every registered producer's
   input stream of P) by DUMP/RESTORE REPLACE, which keeps consumer groups, pending entries and
   TTLs; P's sessions' members of the shard-wide sets (interrupt index and its listing sets,
   deadlines, expiring, idle, the list of sessions, pending counts); and their share of the
   `stats` counters, added on the target in one MULTI with the `copied:P` mark.
5. Flip: `placement.flip(P)` is written on every shard, the target first. The target's
   dispatchers take P's lease and carry on where the source stopped: pending stream entries
   are claimed (the applied marks in each session make replays no-ops), outboxes flushed.
6. Clean: P's keys and members are deleted on the source (its counters lowered), then the
   mover's lease and the `copied:P` mark.

One move or repair runs at a time: each takes the move lock on shard 0 first (parley/fleet/move_lock.py),
and writes each shard's table only if it is still the version it read (write_placement.lua), so
no two writers of version v+1 overwrite each other. An error or Ctrl-C after the freeze stops
the move with a MoveError that says the partition is left frozen and to run `repair`.

A mover that stops half way leaves tables that say so; `repair` finishes the move when the
target holds the `copied:P` mark (flip, clean) and undoes it otherwise (unfreeze, and delete
the partial copy on the target). Inputs XADDed straight to a stream (the development path
without the submit function) are not checked against the table: a sharded deployment's
clients always use the submit function.

The steps' Redis work is done by parley/fleet/placement_writes.py (the table on every shard),
parley/fleet/draining.py (P's jobs on the source) and parley/fleet/copying.py (P's keys).
"""
from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from parley.client.shards import Shards
from parley.fleet.copying import Copier, text
from parley.fleet.draining import drain
from parley.fleet.move_errors import MoveError, TableChanged
from parley.fleet.move_lock import LockHeld, MoveLock
from parley.fleet.placement_writes import PlacementWriter
from parley.schemas.keys import Keys
from parley.schemas.moves import (
    COPIED_FIELD_PREFIX,
    DEFAULT_DRAIN_TIMEOUT_S,
    MOVER_LEASE_MS,
    MOVER_TOKEN_PREFIX,
    MovePlan,
    MoveStep,
    Repair,
    RepairStep,
    copied_field,
    plan_move,
    plan_repair,
)
from parley.schemas.shards import Placement, PlacementError

#: how long the fence waits, by default, for the source's dispatchers to give P's lease back
DEFAULT_FENCE_TIMEOUT_S = 120.0


@dataclass
class MoveReport:
    """What a move did, for the CLI to print."""

    partition: int
    source: int
    target: int
    sessions: int = 0
    keys: int = 0
    members: int = 0
    drained_lost: int = 0
    #: seconds the partition was frozen (its inputs refused `moved`): from the freeze written
    #: on every shard to the flip written on every shard
    frozen_s: float = 0.0
    #: sessions of the partition its list on the source missed, added before the freeze
    unlisted: int = 0
    #: the flip is written on every shard (what an error after it leaves: an uncleaned source)
    flipped: bool = False
    #: when the freeze was written (time.monotonic()); 0: not yet
    frozen_at: float = 0.0

    def frozen_so_far(self) -> float:
        """Seconds since the freeze was written (0 before it)."""
        return time.monotonic() - self.frozen_at if self.frozen_at else 0.0

    def frozen_for(self) -> str:
        """How long the partition has been frozen, for a message (empty before the freeze)."""
        return f", frozen for {self.frozen_so_far():.3f} s so far" if self.frozen_at else ""


Say = Callable[[MoveStep, str], None]


def _quiet(_step: MoveStep, _text: str) -> None:
    pass


class Mover:
    """Moves and repairs partitions of the deployment `shards` names (all of its shards)."""

    def __init__(self, shards: Shards, say: Say = _quiet, poll_s: float = 0.1):
        if not shards.sharded:
            raise MoveError("a deployment of one Redis has nowhere to move a partition: give every "
                            "shard's URL (--redis-url, repeated)")
        self.shards = shards
        self.keys: Keys = shards.keys
        self.say = say
        self.poll_s = poll_s
        self.lock: MoveLock | None = None
        # Moves run at once (`move_many`) change one table: each change is made from the table
        # as it is now, and written everywhere, one at a time (each write only over the version
        # before it, so a change computed from a stale table would be refused, not lost).
        self._table_change = threading.Lock()
        self._half_written = False
        self.tables = PlacementWriter(shards, lambda: self.lock is not None and self.lock.lost)
        self.copier = Copier(self.keys)

    def locked(self) -> MoveLock:
        """The move lock on shard 0, taken (MoveError naming its holder when another has it)."""
        lock = MoveLock(self.shards.clients, self.keys.partitions_lock)
        try:
            self.lock = lock.__enter__()
        except LockHeld as exc:
            raise MoveError(str(exc)) from None
        return lock

    # ---- the move ------------------------------------------------------------------------
    def move(self, partition: int, to: int, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
             fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S) -> MoveReport:
        lock = self.locked()
        try:
            placement = self.shards.check()
            assert placement is not None  # sharded: check() raises rather than find none
            return self._move(plan_move(placement, partition, to), drain_timeout_s, fence_timeout_s)
        finally:
            lock.__exit__(None, None, None)
            self.lock = None

    def move_many(self, moves: Sequence[tuple[int, int]], parallel: int = 1,
                  drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
                  fence_timeout_s: float = DEFAULT_FENCE_TIMEOUT_S) -> list[MoveReport | MoveError]:
        """Each (partition, target) of `moves`, up to `parallel` at once, under one move lock;
        each a whole move (its own freeze, drain, copy and flip), so a partition is frozen only
        for its own move. Every move is checked against the table before any starts (MoveError:
        none started). After a move fails, no other is started; those under way finish. Returns,
        in `moves`' order, each move's report or its MoveError (None started: its error says so)."""
        if parallel < 1:
            raise MoveError(f"moves at once must be at least 1, not {parallel}")
        lock = self.locked()
        try:
            placement = self.shards.check()
            assert placement is not None
            partitions = [p for p, _to in moves]
            if len(set(partitions)) != len(partitions):
                raise MoveError("a partition is named twice: each moves once")
            try:
                plans = [plan_move(placement, p, to) for p, to in moves]
            except PlacementError as exc:
                raise MoveError(f"{exc}: no move was started") from None
            failed = threading.Event()

            def one(plan: MovePlan) -> MoveReport | MoveError:
                if failed.is_set():
                    return MoveError(f"partition {plan.partition}: not started, as another move failed")
                try:
                    return self._move(plan, drain_timeout_s, fence_timeout_s)
                except MoveError as exc:
                    failed.set()
                    return exc
                except Exception as exc:  # before its freeze (a shard not answering its checks)
                    failed.set()
                    return MoveError(f"partition {plan.partition}: {exc!r} before its freeze: nothing "
                                     "of it was changed")

            with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="move") as pool:
                return list(pool.map(one, plans))
        finally:
            lock.__exit__(None, None, None)
            self.lock = None

    def change_table(self, plan: MovePlan, change: Callable[[Placement], Placement]) -> Placement:
        """`change` made to the table as it is now (other moves may have changed it since
        `plan` was made), written on every shard in `plan`'s order; the table written."""
        with self._table_change:
            if self._half_written:
                # shards hold two versions now: a change over either would leave two tables of
                # one version on different shards, which no reader could order
                raise TableChanged("an earlier table write of this command stopped half way: nothing "
                                   "more is written", 0)
            current = self.shards.placement
            assert current is not None
            changed = change(current)
            try:
                self.write_everywhere(plan, changed)
            except TableChanged as exc:
                self._half_written = exc.written > 0  # refused on the first shard: none written
                raise
            except BaseException:
                self._half_written = True  # a shard may or may not hold the new table
                raise
            return changed

    def _move(self, plan: MovePlan, drain_timeout_s: float, fence_timeout_s: float) -> MoveReport:
        partition, to = plan.partition, plan.target
        self.check_engine_keys(plan)
        report = MoveReport(partition, plan.source, plan.target)
        report.unlisted = self.check_listed(plan)
        report.frozen_at = time.monotonic()
        try:
            frozen = self.change_table(plan, lambda table: table.freeze(partition, to))
        except TableChanged as exc:
            if exc.written == 0:
                raise  # refused on the first shard: nothing changed
            raise self.left_frozen(plan, report, exc) from exc
        except BaseException as exc:
            raise self.left_frozen(plan, report, exc) from exc
        try:
            return self._moved(plan, frozen, report, drain_timeout_s, fence_timeout_s)
        except MoveError as exc:
            if getattr(exc, "unfrozen", False):
                raise
            raise self.left_frozen(plan, report, exc) from exc
        except BaseException as exc:  # a Redis error, Ctrl-C: the table says frozen, say so
            raise self.left_frozen(plan, report, exc) from exc

    def left_frozen(self, plan: MovePlan, report: MoveReport, exc: BaseException) -> MoveError:
        why = str(exc) or type(exc).__name__
        if report.flipped:
            return MoveError(f"{why}: partition {plan.partition} is on shard {plan.target} but shard "
                             f"{plan.source} is not cleaned of it: run `parley partitions repair`")
        return MoveError(f"{why}: partition {plan.partition} is left frozen (moving to {plan.target}"
                         f"{report.frozen_for()}): run `parley partitions repair`")

    def _moved(self, plan: MovePlan, frozen: Placement, report: MoveReport,
               drain_timeout_s: float, fence_timeout_s: float) -> MoveReport:
        partition = plan.partition
        self.say(MoveStep.FREEZE, f"partition {partition} frozen (table version {frozen.version})")
        try:
            token = self.fence(plan, fence_timeout_s)
        except MoveError as exc:
            self.change_table(plan, lambda table: table.unfreeze(partition))
            undone = MoveError(f"{exc}; partition {partition} was frozen "
                               f"{report.frozen_so_far():.3f} s")
            undone.unfrozen = True  # type: ignore[attr-defined]
            raise undone from exc
        self.say(MoveStep.FENCE, f"lease of partition {partition} on shard {plan.source} taken")
        report.drained_lost = self.drain(plan, drain_timeout_s)
        self.say(MoveStep.DRAIN, f"jobs drained ({report.drained_lost} recorded lost at the timeout)")
        report.sessions, report.keys, report.members = self.copy(plan)
        self.say(MoveStep.COPY, f"{report.sessions} sessions, {report.keys} keys and {report.members} "
                                f"members copied to shard {plan.target}")
        flipped = self.change_table(plan, lambda table: table.flip(partition))
        report.flipped = True
        report.frozen_s = report.frozen_so_far()
        self.say(MoveStep.FLIP, f"partition {partition} is on shard {plan.target} "
                                f"(table version {flipped.version}; frozen {report.frozen_s:.3f} s)")
        self.clean(plan.source, partition, flipped.partitions, lower_stats=True)
        self.release_fence(plan.source, partition, token)
        self.shards.clients[plan.target].hdel(self.keys.config, copied_field(partition))
        self.say(MoveStep.CLEAN, f"shard {plan.source} cleaned of partition {partition}")
        return report

    def check_listed(self, plan: MovePlan) -> int:
        """Before the freeze, while P is still served: on an indexed source, P's sessions that
        its list misses (created by a dispatcher of an older release, after the shard was
        marked) are added, so that the copy, which reads the list, carries them. A scan of the
        source, but outside the freeze: nobody waits on it. Returns how many it added."""
        src = self.shards.clients[plan.source]
        if not self.copier.indexed(src):
            return 0  # the copy scans the source itself
        added = self.copier.index(src, plan.frozen.partitions, only=plan.partition)
        if added:
            self.say(MoveStep.FREEZE, f"{added} session(s) of partition {plan.partition} were missing "
                                      "from its list on the source (an older dispatcher's?): added")
        return added

    def check_engine_keys(self, plan: MovePlan) -> None:
        """The moved streams may hold inputs the engine signed on the source (a sub-agent's
        spawn or close): the target verifies them with its own engine key, which must be the
        same (dispatchers of several shards share shard 0's: dispatcher/engine_key.py)."""
        src, dst = (self.shards.clients[s].get(self.keys.engine_key) for s in (plan.source, plan.target))
        if src is not None and dst is not None and src != dst:
            raise MoveError(f"shards {plan.source} and {plan.target} hold different engine keys, so "
                            "inputs the engine signed on one would be refused on the other: nothing "
                            "was changed (see \"Moving a partition\" in the operations guide)")

    def write_everywhere(self, plan: MovePlan, placement: Placement) -> None:
        """`placement` on every shard in the plan's order, each only over the version before it."""
        self.tables.everywhere(plan, placement)

    def fence(self, plan: MovePlan, timeout_s: float) -> str:
        """Take P's lease on the source once its dispatcher has given it back."""
        src = self.shards.clients[plan.source]
        token = f"{MOVER_TOKEN_PREFIX}{secrets.token_hex(8)}"
        deadline = time.monotonic() + timeout_s
        while not src.set(self.keys.lease(plan.partition), token, nx=True, px=MOVER_LEASE_MS):
            if time.monotonic() >= deadline:
                raise MoveError(f"a dispatcher of shard {plan.source} still holds partition "
                                f"{plan.partition}'s lease after {timeout_s:g} s (one of a version "
                                "without shards?): the move is undone, nothing was copied")
            time.sleep(self.poll_s)
        return token

    def release_fence(self, shard: int, partition: int, token: str | None = None) -> None:
        """Delete the mover's lease (any mover's when `token` is None: repair)."""
        r = self.shards.clients[shard]
        raw = r.get(self.keys.lease(partition))
        held = None if raw is None else text(raw)
        if held is not None and (held == token if token else held.startswith(MOVER_TOKEN_PREFIX)):
            r.delete(self.keys.lease(partition))

    # ---- drain, copy, clean ---------------------------------------------------------------
    def drain(self, plan: MovePlan, timeout_s: float) -> int:
        """Wait for P's jobs on the source to finish; record the rest lost at the timeout.
        Returns how many were recorded lost (parley/fleet/draining.py)."""
        return drain(self.shards.clients[plan.source], self.keys, plan.partition,
                     plan.frozen.partitions, timeout_s, self.poll_s)

    def copy(self, plan: MovePlan) -> tuple[int, int, int]:
        """P's keys and members from the source to the target (parley/fleet/copying.py)."""
        return self.copier.copy(self.shards.clients[plan.source], self.shards.clients[plan.target],
                                plan.partition, plan.frozen.partitions, plan.target)

    def clean(self, shard: int, partition: int, partitions: int, lower_stats: bool) -> int:
        """Delete P's keys and members on `shard` (parley/fleet/copying.py, `Copier.clean`)."""
        return self.copier.clean(self.shards.clients[shard], partition, partitions, lower_stats)

    # ---- repair --------------------------------------------------------------------------
    def newest(self) -> Placement:
        newest = self.shards.refresh()
        if newest is None:
            raise MoveError("the shards hold no placement: there is nothing to repair")
        if newest.shards != len(self.shards.clients):
            raise MoveError(f"the deployment has {newest.shards} shards and {len(self.shards.clients)} "
                            "URLs were given: give every shard's URL, in order")
        return newest

    def copied_marks(self) -> dict[int, int]:
        marks: dict[int, int] = {}
        for r in self.shards.clients:
            try:
                fields: Any = r.hgetall(self.keys.config)
            except (redis.ConnectionError, redis.TimeoutError):
                continue  # a shard down holds no mark a repair could act on now
            for name, value in (fields or {}).items():
                field = text(name)
                if field.startswith(COPIED_FIELD_PREFIX):
                    marks[int(field.removeprefix(COPIED_FIELD_PREFIX))] = int(text(value))
        return marks

    def repair(self) -> list[RepairStep]:
        """Finish or undo what a stopped move left: the newest table written on every shard,
        then each step of `plan_repair` done. Under the move lock: refused while a move runs."""
        lock = self.locked()
        try:
            return self._repair()
        finally:
            lock.__exit__(None, None, None)
            self.lock = None

    def _repair(self) -> list[RepairStep]:
        views = self.shards.views(answering=True)
        placement = self.newest()
        order = list(range(len(self.shards.clients)))
        for view in views:  # a table written on some shards only: the newest everywhere
            held = view.placement
            if held != placement:
                self.tables.write(view.index, placement, None if held is None else held.version)
                self.say(MoveStep.FLIP, f"shard {view.index}: table version {placement.version} written "
                                        f"(it held {'none' if held is None else held.version})")
        if self.shards.down:
            self.say(MoveStep.FLIP, f"shard(s) {self.shards.down} do not answer: run repair again once "
                                    "they are back, to give them the newest table")
        steps = plan_repair(placement, self.copied_marks())
        for step in steps:
            p, n = step.partition, placement.partitions
            if step.action is Repair.FLIP:
                plan = MovePlan(p, step.source, step.target, placement, placement.flip(p))
                self.write_everywhere(plan, plan.flipped)
                placement = plan.flipped
                self.clean(step.source, p, n, lower_stats=True)
                self.release_fence(step.source, p)
                self.shards.clients[step.target].hdel(self.keys.config, copied_field(p))
            elif step.action is Repair.UNFREEZE:
                plan = MovePlan(p, step.source, step.target, placement, placement)
                placement = placement.unfreeze(p)
                self.write_everywhere(plan, placement)
                self.clean(step.target, p, n, lower_stats=False)
                self.release_fence(step.source, p)
            else:
                for s in order:
                    if s != step.target:
                        self.clean(s, p, n, lower_stats=True)
                        self.release_fence(s, p)
                self.shards.clients[step.target].hdel(self.keys.config, copied_field(p))
        return steps
