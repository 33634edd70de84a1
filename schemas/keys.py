"""Every Redis key name Parley uses, in one place.

All keys of one session carry the hash tag `{S}`, so a transition's commit touches one
cluster slot. Keys outside a session (streams, leases, the interrupt index) are
named here too; nothing else in the code builds a key with an f-string.
"""

import re
import zlib
from dataclasses import dataclass

from parley.schemas.ids import root_session

# One or more names of ASCII letters, digits, `.`, `_`, `-`, joined by single colons. Outside
# it: braces (a hash tag would put every key of every session in one cluster slot), glob
# characters (they break ACL key patterns and SCAN patterns), whitespace and control
# characters (logs, the command line), and empty names.
PREFIX_NAME = r"[A-Za-z0-9._-]+"
PREFIX_PATTERN = rf"{PREFIX_NAME}(?::{PREFIX_NAME})*"
PREFIX_MAX_CHARS = 64
PREFIX_RULE = (f"1-{PREFIX_MAX_CHARS} characters: names of ASCII letters, digits, '.', '_' or '-', "
               "joined by single colons (e.g. 'acme:parley')")
_PREFIX_RE = re.compile(rf"\A{PREFIX_PATTERN}\Z")


def check_prefix(prefix: str) -> str:
    """`prefix` if every key built from it works, else ValueError saying the rule."""
    if not isinstance(prefix, str) or len(prefix) > PREFIX_MAX_CHARS or not _PREFIX_RE.match(prefix):
        raise ValueError(f"invalid key prefix {prefix!r}: use {PREFIX_RULE}")
    return prefix


def stream_of_partition(stream: str, partition: int) -> str:
    """A partitioned stream's name for another partition: `<base>:<p>` -> `<base>:<partition>`."""
    base, _, suffix = stream.rpartition(":")
    if not base or not suffix.isdigit():
        raise ValueError(f"{stream} is not a partitioned stream")
    return f"{base}:{partition}"


def partition_of(session: str, partitions: int) -> int:
    """The partition of a session: n = crc32(root session id) mod N (docs/design.md). By the
    root (schemas/ids.py `root_session`): a sub-agent `S:sub-1` is in `S`'s partition, so
    spawning and reporting stay on one partition, and on one shard (schemas/shards.py)."""
    return zlib.crc32(root_session(session).encode()) % partitions


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "parley"

    def __post_init__(self) -> None:
        check_prefix(self.prefix)  # every process builds its Keys at start: a bad prefix stops it there

    # ---- global -------------------------------------------------------------
    @property
    def config(self) -> str:
        return f"{self.prefix}:config"

    @property
    def partitions_lock(self) -> str:
        """String, on shard 0 only: the holder of the one `parley partitions move` or `repair`
        running (`host:pid:token`), set NX with an expiry the mover renews while it runs."""
        return f"{self.prefix}:partitions:lock"

    def inputs(self, partition: int | None = None, partitions: int = 1) -> str:
        return f"{self.prefix}:inputs" if partitions <= 1 else f"{self.prefix}:inputs:{partition}"

    def results(self, partition: int | None = None, partitions: int = 1) -> str:
        return f"{self.prefix}:results" if partitions <= 1 else f"{self.prefix}:results:{partition}"

    def inputs_of(self, session: str, partitions: int) -> str:
        """The input stream a session's entries go to (its partition's)."""
        return self.inputs(partition_of(session, partitions), partitions)

    def results_of(self, session: str, partitions: int) -> str:
        """The results stream of a session's work, partitioned like its inputs."""
        return self.results(partition_of(session, partitions), partitions)

    # ---- producers (docs/protocol.md, "Writing inputs") ------------------------------------
    @property
    def producers(self) -> str:
        """Hash: producer name -> JSON of its registration (its tenant, when scoped to one). Each
        producer writes only its own input streams; dispatchers read every registered one."""
        return f"{self.prefix}:producers"

    def producer_inputs(self, producer: str, partition: int | None = None, partitions: int = 1) -> str:
        """A producer's own input stream (its partition's, when partitioned): only that producer's
        login may write it, so what it does to the stream (trim it, jam its ids) hurts it alone."""
        base = f"{self.prefix}:in:{producer}"
        return base if partitions <= 1 else f"{base}:{partition}"

    def pending(self, producer: str) -> str:
        """Hash: session -> a producer's inputs admitted by the submit function and not yet
        applied (the per-session admission limit); decremented as the dispatcher acknowledges."""
        return f"{self.prefix}:pending:{producer}"

    @property
    def rejected(self) -> str:
        return f"{self.prefix}:inputs:rejected"

    def lease(self, partition: int) -> str:
        return f"{self.prefix}:lease:{partition}"

    def partition_sessions(self, partition: int) -> str:
        """Sorted set, score 0: the sessions of one partition that exist on this shard (a
        sub-agent's child by its root's partition). The commit that creates a session adds it,
        the expiry sweep removes it with the session's keys; a move finds the partition's keys
        and members from it without scanning the shard, writes it on the target and deletes it
        on the source (schemas/moves.py, parley/fleet/copying.py). `<prefix>:config` field
        `partition_sessions` says it is complete (`parley partitions index` filled it for the
        sessions older than it)."""
        return f"{self.prefix}:partition:{partition}:sessions"

    @property
    def interrupt_index(self) -> str:
        """Sorted set of open interrupts across sessions, scored by raise time."""
        return f"{self.prefix}:interrupts"

    @property
    def interrupt_info(self) -> str:
        """Hash: index member -> JSON details of the open interrupt."""
        return f"{self.prefix}:interrupts:info"

    # The listing's secondary sorted sets (parley/client/inbox.py), all of score 0, read by ZRANGE BYLEX:
    # members `raised_at (15 digits) US session US interrupt_id`, so byte order is raise order;
    # the session set's `session US raised_at US interrupt_id`, for a session prefix's range.
    @property
    def interrupts_by_time(self) -> str:
        return f"{self.prefix}:interrupts:by-time"

    @property
    def interrupts_by_session(self) -> str:
        return f"{self.prefix}:interrupts:by-session"

    @property
    def interrupts_for_anyone(self) -> str:
        """The open interrupts without `resumable_by`: any principal may resume them."""
        return f"{self.prefix}:interrupts:anyone"

    def interrupts_of_reason(self, reason: str) -> str:
        return f"{self.interrupts_reason_prefix}{reason}"

    def interrupts_of_principal(self, principal: str) -> str:
        """The open interrupts naming this principal in `resumable_by`."""
        return f"{self.interrupts_principal_prefix}{principal}"

    @property
    def interrupts_reason_prefix(self) -> str:
        return f"{self.prefix}:interrupts:reason:"

    @property
    def interrupts_principal_prefix(self) -> str:
        return f"{self.prefix}:interrupts:principal:"

    @property
    def interrupt_anchors(self) -> str:
        """Hash: session + anchor (empty: a global interrupt) -> open interrupts parking it; kept
        with the index, so `parley_parked_branches` (`stats` field `parked`) is one HGET."""
        return f"{self.prefix}:interrupts:anchors"

    def inbox_signin(self, sid: str) -> str:
        """String, with a TTL: one sign-in to the inbox page (parley/web/signins.py), on the
        first shard; deleted on sign-out."""
        return f"{self.prefix}:inbox:signin:{sid}"

    @property
    def keyprints(self) -> str:
        """Hash, on each shard: dispatcher name -> JSON of the fingerprints of the signing keys
        it verifies with (schemas/keyprints.py; never a key), written by each dispatcher of the
        shard at its start and at every reload of its keys file, deleted at its clean stop. The
        inbox reads it at start to say when it signs with a key the dispatchers do not have."""
        return f"{self.prefix}:keyprints"

    @property
    def feed(self) -> str:
        """Stream, capped: the fleet-wide feed of interrupt and turn events of every session,
        written by the commit script with the session's own events (docs/protocol.md, "Feed")."""
        return f"{self.prefix}:feed"

    @property
    def feed_dead(self) -> str:
        """Stream, capped: feed entries `parley notify` gave up forwarding, with the error."""
        return f"{self.prefix}:feed:dead"

    @property
    def deadlines(self) -> str:
        """Sorted set of open interrupts with a timeout, scored by deadline (Unix ms)."""
        return f"{self.prefix}:deadlines"

    @property
    def engine_key(self) -> str:
        """String: the secret that signs the inputs dispatchers write themselves (a sub-agent's
        child); made by the first dispatcher, readable by dispatchers only (users.acl)."""
        return f"{self.prefix}:engine:key"

    @property
    def running(self) -> str:
        """Hash: RQ job id -> JSON record of the job a worker is running (for lost-work detection)."""
        return f"{self.prefix}:running"

    @property
    def inflight(self) -> str:
        """Hash: RQ job id -> JSON record of every job enqueued and not yet answered, so a job
        lost between a worker's dequeue and its running record is still noticed."""
        return f"{self.prefix}:inflight"

    def job_token(self, job_id: str) -> str:
        """String: the token of a queued job (schemas/signing.py `job_token`), written with the
        job by its dispatcher and read-and-deleted by the take that claims it."""
        return f"{self.prefix}:jobtoken:{job_id}"

    def inflight_order(self, queue: str) -> str:
        """Sorted set: RQ job id -> enqueue sequence number, for the in-flight jobs of one RQ
        queue (by its name, `Keys.queue`). Numbered in the MULTI that pushes them, so the order
        is the queue's own: the jobs numbered below the queue's head have left the queue."""
        return f"{self.prefix}:inflight:{queue}"

    def last_take(self, worker: str) -> str:
        """What a worker's last take_job.lua call took (token, job): a retried call gets it back."""
        return f"{self.prefix}:took:{worker}"

    def worker_alive(self, worker: str) -> str:
        """A worker's heartbeat: present while the worker process lives (short PX, renewed)."""
        return f"{self.prefix}:worker:{worker}"

    def is_results_stream(self, stream: str) -> bool:
        """True for `results()` and `results(n, N)`: the streams this deployment's workers may
        post outcomes to (a job naming another key is refused)."""
        base = self.results()
        if stream == base:
            return True
        partition = stream.removeprefix(base + ":")
        return partition != stream and partition.isascii() and partition.isdigit()

    @property
    def stats(self) -> str:
        """Hash of fleet-wide gauges kept by outbox effects (`held`: held decisions; `parked`:
        distinct parked anchors, kept with the interrupt index; `listing`: 1 once the listing's
        sets are built, rebuild_index.lua)."""
        return f"{self.prefix}:stats"

    @property
    def dispatchers(self) -> str:
        """Sorted set of live dispatchers by last registration (Unix ms), for sharing partitions."""
        return f"{self.prefix}:dispatchers"

    GROUP = "parley-dispatchers"

    def queue(self, kind: str) -> str:
        """RQ queue names: `decide`, `llm`, `tools`; prefixed when the prefix is not the default,
        so two deployments sharing one Redis do not share queues."""
        return kind if self.prefix == "parley" else f"{self.prefix}-{kind}"

    # ---- session lifecycle (docs/operations.md, "Retention and archive") ----------
    def sessions_of_status(self, status: str) -> str:
        """Sorted set, score 0, of the sessions in one listing status (`active`, `parked`,
        `closed`): members `created_at (15 digits) US session` (schemas/listing.py), so byte
        order is creation order and a page is one ZRANGE BYLEX."""
        return f"{self.prefix}:sessions:{status}"

    def sessions_of_metadata(self, key: str, value: str) -> str:
        """Sorted set like `sessions_of_status`, of the sessions created with metadata
        `key` = `value` (the indexed pairs: schemas/listing.py `metadata_pairs`)."""
        return f"{self.prefix}:sessions:meta:{key}\x1f{value}"

    @property
    def archive(self) -> str:
        """Stream: one entry per closed session (its whole document), for an archive consumer
        to store before the session expires (parley/client/export.py reads an entry)."""
        return f"{self.prefix}:archive"

    @property
    def expiring(self) -> str:
        """Sorted set: closed session -> when its retention ends (Unix ms); the expiry sweep
        deletes every key of a session found due here, and its listing entries."""
        return f"{self.prefix}:expiring"

    @property
    def idle(self) -> str:
        """Sorted set: open session -> when it has been idle long enough to be closed (Unix ms),
        kept only when an idle timeout is configured."""
        return f"{self.prefix}:idle"

    # ---- per session (hash tag {S}) -------------------------------------------
    def meta(self, session: str) -> str:
        """Hash: ver, core (JSON), applied (JSON: stream -> last applied entry id)."""
        return f"{self.prefix}:{{{session}}}:meta"

    def messages(self, session: str) -> str:
        """Hash: message id -> message JSON (append-only)."""
        return f"{self.prefix}:{{{session}}}:msgs"

    def events(self, session: str) -> str:
        return f"{self.prefix}:{{{session}}}:events"

    def deltas(self, session: str) -> str:
        """Stream, capped and expiring: the pieces of the session's model replies as they are
        generated, written by workers (schemas/deltas.py; docs/protocol.md, "Token streaming")."""
        return f"{self.prefix}:{{{session}}}:deltas"

    def outbox(self, session: str) -> str:
        """Hash: effect seq -> effect JSON, flushed after each commit."""
        return f"{self.prefix}:{{{session}}}:outbox"

    def idempotency_keys(self, session: str) -> str:
        """Sorted set: the session's used idempotency keys -> when each stops counting (Unix
        ms). One key per session instead of one per input, so expiring a session deletes them."""
        return f"{self.prefix}:{{{session}}}:idem"

    def session_keys(self, session: str) -> list[str]:
        """Every key a session owns (what expiry deletes; a test counts them)."""
        return [self.meta(session), self.messages(session), self.events(session),
                self.outbox(session), self.idempotency_keys(session), self.deltas(session)]

    @staticmethod
    def index_member(session: str, interrupt_id: str) -> str:
        return f"{session}\x1f{interrupt_id}"

