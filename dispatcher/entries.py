"""Stream entries to transitions: decode, verify, and bind each entry to the machine.

This is the dispatcher's one door into the pure core (dispatcher/core/): the only
module that calls `apply_input`, `apply_outcome`, builds a `Context` or asks `input_refs`. A
decoded entry becomes a `Prepared`, whose `compute(state, ctx)` is its transition once its
session is loaded; a bad one becomes a `Refused`, for the rejected stream. No I/O happens
here, so the consume loop decides when to load and commit (docs/design.md, "Consuming
streams").
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from parley.dispatcher.core import (
    AdmissionLimits,
    AppInfo,
    Context,
    Lifecycle,
    Limits,
    Transition,
    apply_input,
    apply_outcome,
)
from parley.runtime import telemetry
from parley.runtime.logs import kv
from parley.schemas.codec import InputError, decode_input_entry, input_refs, wide_integer_path
from parley.schemas.codes import RefusalCode
from parley.schemas.jobs import job_id
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import (
    ENGINE_PRINCIPAL,
    ENGINE_SIG_FIELD,
    JOB_SIG_FIELD,
    Keyring,
    Unauthorized,
    engine_signed,
    job_signed,
)
from parley.schemas.state import SessionState

log = logging.getLogger("parley.dispatcher")


@dataclass(slots=True)
class Prepared:
    """An entry decoded and verified, waiting for its wave: its session, its idempotency key,
    and its transition as a function of the loaded state and the wave's context."""

    entry_id: str
    fields: dict[Any, Any]
    session: str
    idem: str | None
    compute: Callable[[SessionState, Context], Transition]


@dataclass(slots=True)
class Refused:
    """An entry for the rejected stream (bad, unauthorized, or its decoder raised), and the
    idempotency key its refusal uses up: only a verified entry's valid key (docs/protocol.md,
    "Writing inputs"), so an unverified one can never make a later genuine entry `duplicate`."""

    error: InputError
    code: RefusalCode = RefusalCode.INVALID_INPUT
    uses_key: str | None = None


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def already_applied(marker: str | None, entry_id: str) -> bool:
    """Entry ids of a stream only grow and one reader applies them in order, so an id at or
    below the session's marker for that stream was applied before: its replay is a no-op."""
    return marker is not None and entry_key(entry_id) <= entry_key(marker)


#: how far ahead of the dispatcher's clock an input entry's id may be: Redis makes ids from its
#: own clock, so only a producer's explicit id is further ahead than clocks drift apart
FUTURE_ID_MARGIN_MS = 10 * 60 * 1000


def ahead_of_clock(entry_id: str, now_ms: int, margin_ms: int = FUTURE_ID_MARGIN_MS) -> bool:
    """Whether an entry's id is further in the future than any id Redis makes itself: written
    with an explicit id. Applied, it would become its session's marker for the stream, and
    should the stream ever be deleted and made again (docs/operations.md, the runbook for a
    stream jammed by the last possible id), every later input of that session from it would
    be taken for a replay and dropped. So it is refused, and never becomes a marker."""
    return entry_key(entry_id)[0] > now_ms + margin_ms


def poisoned(stream: str, entry_id: str, exc: BaseException | None) -> Refused:
    """An exception decoding an entry or computing its transition (a bug, nothing committed):
    the entry goes to the rejected stream with the error rather than stopping its partition
    for good. A failure after the commit propagates instead: the entry stays pending and its
    replay flushes what the commit left (docs/design.md, "Consuming streams")."""
    log.error("entry could not be applied; moved to the rejected stream",
              extra=kv(stream=stream, entry=entry_id), exc_info=exc)
    return Refused(InputError(f"internal error: {type(exc).__name__}: {exc}"))


@dataclass
class EntryDecoder:
    """What the machine needs besides the state: the app's shape, limits, sub-agents, keys."""

    app: AppInfo
    limits: Limits = field(default_factory=Limits)
    agents: dict[str, AppInfo] = field(default_factory=dict)
    keyring: Keyring = field(default_factory=lambda: Keyring({}))
    #: the keys file read again when due (dispatcher/keys_reload.py): the new keyring, or None
    reload_keys: Callable[[Keyring], Keyring | None] | None = None
    #: the engine's key read again, or None when read too recently (dispatcher/engine_key.py):
    #: Redis may have lost the key this copy verifies with, and a dispatcher made a new one
    reload_engine_key: Callable[[], str | None] | None = None
    #: retention and idle timeout (the dispatcher's flags)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    #: the admission limits (the dispatcher's flags): the input size at decode, the rest as applied
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)

    def context(self, results_stream: str) -> Context:
        """The context of one load-compute-commit round: the time is read once for all of it."""
        return Context(now_ms=int(time.time() * 1000), app=self.app, results_stream=results_stream,
                       limits=self.limits, agents=self.agents, lifecycle=self.lifecycle,
                       admission=self.admission, tracing=telemetry.enabled())

    def prepare(self, stream: str, inputs: bool, entry_id: str, fields: dict[Any, Any]) -> Prepared | Refused:
        """An entry of an input stream (`inputs`) or of a results stream, ready for its wave."""
        return self._input(stream, entry_id, fields) if inputs else self._outcome(entry_id, fields)

    def _input(self, stream: str, entry_id: str, fields: dict[Any, Any]) -> Prepared | Refused:
        if ahead_of_clock(entry_id, int(time.time() * 1000)):
            input_type, ids = input_refs(fields)
            return Refused(InputError(f"entry id {entry_id} is ahead of the clock: written with an "
                                      "explicit id; let Redis choose it (XADD ... *)", input_type, ids))
        # The signature first: an entry whose sender is not verified is refused before anything
        # of it is believed, so it uses up no idempotency key, even when it is malformed too.
        try:
            principal = self._verify(fields)
        except Unauthorized as exc:
            input_type, ids = input_refs(fields)
            return Refused(InputError(f"unauthorized: {exc}", input_type, ids), code=RefusalCode.UNAUTHORIZED)
        try:
            entry = decode_input_entry(fields, self.admission.input_bytes)
        except InputError as exc:
            return Refused(exc, code=exc.code, uses_key=exc.idempotency_key)
        except Exception as exc:  # the decoder's own bug: same as a machine bug
            return poisoned(stream, entry_id, exc)
        entry = replace(entry, principal=principal)
        # The state handed to the transition is a fresh load used once: no defensive copy.
        return Prepared(entry_id, fields, entry.session, entry.idempotency_key,
                        lambda state, ctx: apply_input(state, entry, entry_id, ctx, owned=True))

    def _verify(self, fields: dict[Any, Any]) -> str | None:
        now_ms = int(time.time() * 1000)
        try:
            return self.keyring.verify(fields, now_ms)
        except Unauthorized:
            claimed = fields.get(b"principal", fields.get("principal"))
            if claimed not in (ENGINE_PRINCIPAL, ENGINE_PRINCIPAL.encode()) or not self._newer_engine_key():
                raise
            return self.keyring.verify(fields, now_ms)

    def _newer_engine_key(self) -> bool:
        """After an engine signature this copy rejected: take the engine's key Redis holds now (or
        this process's signer has just read), True when it is another one than this copy's."""
        fresh = self.reload_engine_key() if self.reload_engine_key is not None else None
        if fresh is None or fresh == self.keyring.engine_key:
            return False
        self.keyring = self.keyring.with_engine_key(fresh)
        return True

    def _engine_signed(self, raw: bytes | str | None, sig: bytes | str | None) -> bool:
        """`sig` is the engine's signature of the outcome `raw`, by the key this copy holds or by
        the one Redis holds now (read again at most once a second, as for engine inputs)."""
        body = raw.encode() if isinstance(raw, str) else (raw or b"")
        text = sig.decode(errors="replace") if isinstance(sig, bytes) else sig
        if engine_signed(self.keyring.engine_key, body, text):
            return True
        if text is None or not self._newer_engine_key():
            return False
        return engine_signed(self.keyring.engine_key, body, text)

    def _taker_signed(self, outcome: WorkOutcome, raw: bytes | str | None, sig: bytes | str | None) -> bool:
        """`sig` is the signature of the outcome `raw` under the token of its job, which only the
        worker whose take read it knows (schemas/signing.py `job_token`)."""
        body = raw.encode() if isinstance(raw, str) else (raw or b"")
        text = sig.decode(errors="replace") if isinstance(sig, bytes) else sig
        jid = job_id(outcome.session, outcome.work, outcome.attempt)
        if job_signed(self.keyring.engine_key, jid, body, text):
            return True
        if text is None or not self._newer_engine_key():
            return False
        return job_signed(self.keyring.engine_key, jid, body, text)

    def reload_keys_if_due(self) -> None:
        """Swap in the signing keys file's keys when it was signalled or changed; between two
        entries, so no entry is verified with half of one file and half of another."""
        if self.reload_keys is not None and (keyring := self.reload_keys(self.keyring)) is not None:
            self.keyring = keyring

    def _outcome(self, entry_id: str, fields: dict[Any, Any]) -> Prepared | Refused:
        raw = fields.get(b"outcome", fields.get("outcome"))
        try:
            outcome = WorkOutcome.model_validate_json(raw or b"")
        except ValidationError as exc:
            return Refused(InputError(f"invalid work outcome: {exc}"))
        sig = fields.get(ENGINE_SIG_FIELD.encode(), fields.get(ENGINE_SIG_FIELD))
        if outcome.engine_made and not self._engine_signed(raw, sig):
            made = "deadline" if outcome.kind == "deadline" else "sub-agent report"
            return Refused(InputError(f"unauthorized: a {made} outcome without the engine's signature: "
                                      "only a dispatcher makes one", "outcome", {"work": outcome.work}),
                           code=RefusalCode.UNAUTHORIZED)
        job_sig = fields.get(JOB_SIG_FIELD.encode(), fields.get(JOB_SIG_FIELD))
        if not outcome.engine_made and (outcome.unrun or not outcome.lost) \
                and not self._taker_signed(outcome, raw, job_sig):
            # Workers share one login and may write every results stream: only the signature
            # under the job's token, which its take alone read, says the poster took the job.
            # (A plain `lost` needs none: it only makes the engine run the job again when that
            # is safe. `unrun` does: it makes the engine run any job again.)
            return Refused(InputError("unauthorized: an outcome not signed by the worker that took its "
                                      "job", "outcome", {"work": outcome.work}),
                           code=RefusalCode.UNAUTHORIZED)
        outcome = fail_if_wide(outcome)
        return Prepared(entry_id, fields, outcome.session, None,
                        lambda state, ctx: apply_outcome(state, outcome, ctx, owned=True))


def fail_if_wide(outcome: WorkOutcome) -> WorkOutcome:
    """An outcome holding an integer beyond 64 bits (a decision's payload, a tool's result) counts
    as failed: the session's store writes JSON that cannot carry it exactly, and a value rounded
    to a float would be applied as something the app never said (docs/protocol.md, Ids and limits)."""
    path = wide_integer_path({"value": outcome.value, "usage": outcome.usage})
    if path is None:
        return outcome
    return outcome.model_copy(update={
        "ok": False, "value": None, "usage": None,
        "error": f"the outcome has an integer beyond 64 bits at {path}"})
