"""Every code the engine gives a reader, one enum per question it answers.

Members are listed in the order they are checked, so the order a reader sees in
docs/protocol.md ("Refusal and ignore codes") is the order the dispatcher applies.
They are `StrEnum`s: each member is its own wire string (`RefusalCode.BRANCH_PARKED ==
"branch_parked"`), so events, logs and metric labels carry them unchanged.
"""

from enum import StrEnum


class RefusalCode(StrEnum):
    """Why an input was refused (`input.refused`, or the submit function's synchronous
    `PARLEY <code> ...` error): it changed nothing, and the sender should hear why. The first
    three are the dispatcher's, before the session is read; `rate_limited` only the submit
    function's."""

    #: the entry does not decode: not JSON, unknown type, a field of the wrong shape
    INVALID_INPUT = "invalid_input"
    #: the entry's `input` is larger than the input size limit (`limit_input_bytes`)
    TOO_LARGE = "too_large"
    #: a bad or missing signature (a forged entry does not even use up its idempotency key)
    UNAUTHORIZED = "unauthorized"
    #: at submit only: the session already has `limit_pending` of this producer's inputs
    #: admitted and not yet applied (try again once some are)
    RATE_LIMITED = "rate_limited"
    #: at submit only, in a deployment of several shards: the session's partition is being
    #: moved to another shard, or is no longer on this one (retryable: read the placement again
    #: and submit there; the client does this by itself)
    MOVED = "moved"
    #: an entry of a producer scoped to one tenant names a session of another tenant (or of
    #: none): copied to the rejected stream only, never reported in that session's events
    WRONG_TENANT = "wrong_tenant"
    #: what only the dispatcher writes, from anyone else: a session or a turn in a sub-agent's
    #: child id (`<S>:sub-<n>`), a `parent` link (of a session.create or a session.close)
    ENGINE_ONLY = "engine_only"
    #: message.create, branch.switch or tool.result to a closed session
    SESSION_CLOSED = "session_closed"
    #: message.create names a parent that is not in the session
    UNKNOWN_PARENT = "unknown_parent"
    #: message.create under a branch an open interrupt parks (I5; a global one parks all, I3)
    BRANCH_PARKED = "branch_parked"
    #: message.create whose parent is the tip of a turn still running
    TURN_IN_PROGRESS = "turn_in_progress"
    #: message.create with a `message_id` the session already uses
    DUPLICATE_MESSAGE_ID = "duplicate_message_id"
    #: message.create in a session that has `limit_messages` messages, or that would make a
    #: branch beyond `limit_branches` (a new root, or a message under one that has a child)
    SESSION_FULL = "session_full"
    #: branch.switch to a message that is not in the session
    UNKNOWN_MESSAGE = "unknown_message"
    #: interrupt.resume not signed by one of the interrupt's `resumable_by` principals
    FORBIDDEN = "forbidden"
    #: interrupt.resume whose payload does not match the interrupt's `response_schema`
    INVALID_RESUME = "invalid_resume"


class IgnoreCode(StrEnum):
    """Why an input was ignored (`input.ignored`): it asked for something already true or
    already over, so doing nothing is the answer (a replay, a late click)."""

    #: the entry's idempotency key (`id`) was used within the window
    DUPLICATE = "duplicate"
    #: interrupt.resume or session.close to a closed session: its interrupts were cancelled
    #: with it, and it is closed already
    SESSION_CLOSED = "session_closed"
    #: session.create for a session that exists
    SESSION_EXISTS = "session_exists"
    #: interrupt.resume of an interrupt the session never raised (or no such session)
    UNKNOWN_INTERRUPT = "unknown_interrupt"
    #: interrupt.resume of an interrupt already resumed (I11)
    ALREADY_RESUMED = "already_resumed"
    #: tool.result for a call the session never made, or one that is not deferred
    UNKNOWN_CALL = "unknown_call"
    #: tool.result for a call already settled
    ALREADY_SETTLED = "already_settled"
    #: session.close for a session that does not exist (or, the engine's, is not the child of
    #: the closing call)
    UNKNOWN_SESSION = "unknown_session"
    #: the engine's idle close of a session that was active since, or that waits on an
    #: interrupt with a deadline (never closed as idle)
    NOT_IDLE = "not_idle"


class InputOutcome(StrEnum):
    """What became of an input: the `outcome` label of `parley_inputs_total`."""

    #: applied: its events describe what changed
    APPLIED = "applied"
    #: refused with a `RefusalCode`
    REFUSED = "refused"
    #: ignored with an `IgnoreCode`
    IGNORED = "ignored"
    #: not applied at all: copied to the rejected stream (the dispatcher's own refusals)
    REJECTED = "rejected"


class DropReason(StrEnum):
    """Why a work outcome changed nothing (docs/guarantees.md, late results): results can
    arrive late, twice, or for work a pause voided, and each is dropped, never applied."""

    #: the outcome names a session that does not exist
    NO_SESSION = "no_session"
    #: a deadline for an interrupt already resumed (by a client, or an earlier deadline)
    ALREADY_RESUMED = "already_resumed"
    #: a decision for a decide job no longer in flight (voided by a pause, or of an old attempt)
    STALE_DECISION = "stale_decision"
    #: a tool result whose source does not match the call (a sub-agent call's, or a job's)
    WRONG_SOURCE = "wrong_source"
    #: a result for work already settled or voided
    ALREADY_SETTLED = "already_settled"
    #: a result of another attempt (the work was retried), or of the other kind of work
    STALE_ATTEMPT = "stale_attempt"
    #: any outcome for a closed session: it runs nothing more
    SESSION_CLOSED = "session_closed"


class EffectKind(StrEnum):
    """What a transition asks the shell to do after its commit (stored as `op` in the
    session's outbox, in transition order)."""

    #: put a decide, LLM or tool job on its RQ queue
    ENQUEUE = "enqueue"
    #: take a voided job off its queue (best effort: its late result is dropped anyway)
    CANCEL = "cancel"
    #: add an open interrupt to the fleet-wide index (and its deadline, if any)
    INDEX_ADD = "index_add"
    #: remove a resumed interrupt from the index and the deadlines
    INDEX_REMOVE = "index_remove"
    #: start a sub-agent's child session: its creation and first message, as inputs
    SPAWN = "spawn"
    #: a child session's reply, posted as the outcome of its parent's call
    REPORT = "report"
    #: move a fleet-wide counter (the number of held decisions)
    STAT = "stat"
    #: close a sub-agent's child session its parent stopped waiting for (a `session.close` input)
    CLOSE = "close"
    #: put a timer in the deadlines index (a sub-agent call's time limit)
    DEADLINE_ADD = "deadline_add"
    #: take a timer out of the deadlines index (the call was settled in time)
    DEADLINE_REMOVE = "deadline_remove"
    #: a session closed: write its document to the archive, schedule its expiry
    RETIRE = "retire"
    #: an open session's idle time moved: when it may be closed as idle (or never, for now)
    IDLE = "idle"
    #: move the session in the list of sessions (created, parked, active again, closed)
    LISTING = "listing"


class SessionStatus(StrEnum):
    """Whether a session still takes inputs (`Core.status`)."""

    OPEN = "open"
    #: refuses every input (`session_closed`), runs nothing, drops every outcome
    CLOSED = "closed"


class CloseReason(StrEnum):
    """Why the engine closed a session, or the reason a client's close gave none
    (`session.closed` event; a client's `session.close` may give any reason of its own)."""

    #: a client's session.close without a `reason`
    CLOSED = "closed"

    #: its parent's call ran past the sub-agent time limit
    TIMEOUT = "timeout"
    #: its parent's call was settled otherwise (an app's tool.result/tool.error action), or
    #: the parent itself was closed
    ABANDONED = "abandoned"
    #: open with no transition for the dispatcher's --idle-timeout (the idle sweep closed it)
    IDLE = "idle"
    #: a sub-agent's child reported its answer to its parent's call: nothing more can happen in
    #: it (only the engine starts its turns), so it is closed, archived and expires like any other
    REPORTED = "reported"


class CallError(StrEnum):
    """Errors the engine settles a sub-agent call with (the `tool.completed` error)."""

    #: the child's first turn did not end on a reply
    SUBAGENT_FAILED = "subagent_failed"
    #: the child's id was already a session: the call never ran there
    SUBAGENT_SESSION_EXISTS = "subagent_session_exists"
    #: the call ran past its time limit (`fn.timeout_s`, else the dispatcher's --subagent-timeout)
    TIMEOUT = "timeout"
    #: a client closed the child session (`session.close`) before it reported
    SUBAGENT_CLOSED = "subagent_closed"
