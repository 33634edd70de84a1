"""Replica acknowledgements: a batch's entries are acknowledged only once replicas hold it.

Redis replicates asynchronously: a primary killed right after a commit may take that commit
with it, and Sentinel promotes a replica that never saw it. Were the entry acknowledged
(XACK) meanwhile, and its jobs enqueued, the promoted replica could hold the acknowledgement
without the transition, or jobs of a transition it does not know. With `--replica-acks K`
the dispatcher asks `WAIT K timeout` after a batch's commits and before its settle: K
replicas must hold every write so far, or nothing of the batch is acknowledged. Fewer is
handled as an outage (the run loop backs off, then claims its pending entries again), and
the replay of an entry already applied is a no-op that flushes what its outbox still holds
(docs/operations.md, "Failover without loss").

Workers use the same shell (`parley worker --replica-acks K`, workers/jobs.py): an outcome
lost in a failover would leave its running record on the promoted replica, and the session
waiting; confirmed after each post, it is posted again until replicas hold it.

The rule is pure (`confirmed`); `Replicas` is the thin shell that asks Redis. It sits on the
ops floor, below the dispatcher and the workers, which both use it (workers import nothing
of the dispatcher); `parley.dispatcher.replicas` names the same things.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from parley.runtime import metrics
from parley.runtime.logs import kv
from parley.schemas.keys import Keys

_dispatcher_log = logging.getLogger("parley.dispatcher")

DEFAULT_REPLICA_ACK_TIMEOUT_MS = 1000
# The field of the stats hash the probe write bumps (see Replicas.confirm).
WAITS_FIELD = "replica_waits"


@dataclass(frozen=True, slots=True)
class ReplicaPolicy:
    """How many replicas must hold a batch before it is acknowledged (0: none, the default),
    and how long one WAIT may take."""

    acks: int = 0
    timeout_ms: int = DEFAULT_REPLICA_ACK_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.acks < 0:
            raise ValueError(f"replica acks must be 0 or more, got {self.acks}")
        if self.timeout_ms <= 0:
            # WAIT's 0 means "block forever": a dispatcher would then hang, not back off
            raise ValueError(f"the replica ack timeout must be positive, got {self.timeout_ms} ms")

    @property
    def enabled(self) -> bool:
        return self.acks > 0


def confirmed(policy: ReplicaPolicy, replicas: int) -> bool:
    """Whether WAIT's answer (replicas that hold every write so far) lets a batch be
    acknowledged."""
    return not policy.enabled or replicas >= policy.acks


class ServerId(NamedTuple):
    """Which server, in which replication history: its `run_id` (INFO server: another process,
    a restart or another node, has another) and its `master_replid` (INFO replication: it
    changes when the server is promoted, and when it is fully resynced as a replica). A server
    demoted, fully resynced from the new primary (losing what it took meanwhile) and promoted
    again, all within redis-py's retries, keeps its run_id, never its replid."""

    run_id: str = ""
    replid: str = ""

    @property
    def named(self) -> bool:
        return self.run_id != "" and self.replid != ""

    def __str__(self) -> str:
        return f"{self.run_id or '?'}/{self.replid or '?'}"


def take_confirmed(policy: ReplicaPolicy, took_on: ServerId, waited_on: ServerId, replicas: int) -> bool:
    """Whether a worker may run a job it took (`--replica-acks`): the WAIT that answered
    `replicas` ran on the very server that made the take, in the same replication history
    (`took_on`, `waited_on`: the run_id and master_replid the take's reply and the WAIT's
    pipeline came back with). A WAIT on any other server (a promoted replica, the same address
    restarted), or on the same process since promoted again (a replid of its own), counts
    replicas of writes that server holds, and proves nothing of a take it may never have seen
    or may have lost in a full resync; an unnamed server proves nothing."""
    if not policy.enabled:
        return True
    return took_on.named and took_on == waited_on and replicas >= policy.acks


class TakeNotConfirmed(RedisError):
    """The WAIT after a take ran on another server than the take: its job must not run."""


class ReplicasBehind(RedisConnectionError):
    """Fewer replicas than asked hold a batch's commits: nothing of it is acknowledged.

    A ConnectionError, so the dispatcher's loop treats it as what it amounts to, an outage of
    the replicated store: back off, then replay the entries still pending."""


class Replicas:
    """The shell: one WAIT per batch of commits, before their settle (a dispatcher), or after
    each outcome posted (a worker: workers/jobs.py). `behind`: the last WAIT came short, so
    nothing is being acknowledged until the replicas are back (a dispatcher's /readyz says so)."""

    def __init__(self, redis: Redis, keys: Keys, policy: ReplicaPolicy,
                 on_behind: str = "the batch is not acknowledged and will be replayed",
                 log: logging.Logger = _dispatcher_log):
        self.log = log
        self.redis = redis
        self.keys = keys
        self.policy = policy
        self.on_behind = on_behind
        self.behind = False

    def confirm(self) -> None:
        """Return once `policy.acks` replicas hold every write made so far; raise ReplicasBehind
        (logged and counted) when they do not within the timeout."""
        if not self.policy.enabled:
            return
        # WAIT waits for the replication offset of the last write made on ITS connection. The
        # commits ran on a connection of the pool, perhaps not this one (the metrics thread
        # shares the pool), so a write first, on the same connection, in one pipeline: its
        # offset is past every write the server took before it, the commits included.
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(self.keys.stats, WAITS_FIELD, 1)
        pipe.execute_command("WAIT", self.policy.acks, self.policy.timeout_ms)
        replies: Any = pipe.execute()
        replicas = int(replies[-1])
        self.behind = not confirmed(self.policy, replicas)
        if not self.behind:
            return
        metrics.REPLICA_ACK_TIMEOUTS.inc()
        self.log.warning(f"replicas behind: {self.on_behind}",
                    extra=kv(wanted=self.policy.acks, acked=replicas, timeout_ms=self.policy.timeout_ms))
        raise ReplicasBehind(f"{replicas} of {self.policy.acks} replicas acknowledged "
                             f"within {self.policy.timeout_ms} ms")

    def confirm_take(self, took_on: ServerId) -> None:
        """Return once `policy.acks` replicas hold a take made on the server `took_on` (its
        run_id and master_replid); raise otherwise: ReplicasBehind when they are short,
        TakeNotConfirmed when the WAIT was answered by another server, or by the same one in
        another replication history (`take_confirmed`). One pipeline, so one connection: the
        probe write, its WAIT and the name of the server that answered both."""
        if not self.policy.enabled:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(self.keys.stats, WAITS_FIELD, 1)
        pipe.execute_command("WAIT", self.policy.acks, self.policy.timeout_ms)
        pipe.info("server")
        pipe.info("replication")
        replies: Any = pipe.execute()
        replicas = int(replies[1])
        waited_on = ServerId(str(replies[2].get("run_id", "")), str(replies[3].get("master_replid", "")))
        if take_confirmed(self.policy, took_on, waited_on, replicas):
            self.behind = False
            return
        if not took_on.named or waited_on != took_on:
            self.log.warning("a take was not confirmed: the WAIT ran on another server than the take",
                             extra=kv(took_on=str(took_on), waited_on=str(waited_on)))
            raise TakeNotConfirmed(f"the take was made on server {took_on}, the WAIT ran on {waited_on}")
        self.behind = True
        metrics.REPLICA_ACK_TIMEOUTS.inc()
        self.log.warning(f"replicas behind: {self.on_behind}",
                         extra=kv(wanted=self.policy.acks, acked=replicas, timeout_ms=self.policy.timeout_ms))
        raise ReplicasBehind(f"{replicas} of {self.policy.acks} replicas acknowledged "
                             f"within {self.policy.timeout_ms} ms")

    def readiness(self) -> str | None:
        """Why this process is not ready (None: it is, as far as replicas go)."""
        if self.behind:
            return (f"replicas behind: fewer than --replica-acks {self.policy.acks} held the last "
                    f"writes; nothing is acknowledged until they do")
        return None

    def warn_if_short(self) -> int | None:
        """At start: warn when the primary has fewer connected replicas than `policy.acks`
        (nothing would be acknowledged until enough connect). Returns how many it has (None:
        off, or INFO unreadable, which the first WAIT will tell anyway)."""
        if not self.policy.enabled:
            return None
        try:
            info: Any = self.redis.info("replication")
        except RedisError as exc:
            self.log.warning("could not read INFO replication", extra=kv(error=repr(exc)))
            return None
        connected = int(info.get("connected_slaves", 0))
        if connected < self.policy.acks:
            self.log.warning(f"--replica-acks {self.policy.acks} but the primary has {connected} connected "
                        f"replica(s): nothing will be acknowledged until {self.policy.acks} connect",
                        extra=kv(wanted=self.policy.acks, connected=connected))
        return connected
