"""Signed inputs (docs/protocol.md, Signing): HMAC-SHA256 over `session\\nid\\nts\\ninput`, per principal.

Keys come from a JSON file named by the dispatcher's configuration: `{principal: secret}` or
`{principal: [secret, ...]}`. A principal with several keys is being rotated: an entry signed
with any of them verifies, and a signer uses the first (docs/operations.md, "Rotating signing
keys"). Secrets are never logged and never appear in events.

The inputs a dispatcher writes itself (a sub-agent's child: its creation, its close) are
signed the same way by the principal `ENGINE_PRINCIPAL`, with the engine's key: a secret the
first dispatcher stores in Redis, where only dispatchers may read it (deploy/redis/users.acl).
They pass `--require-signing` like any signed entry, and a producer cannot make one.
"""

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

WINDOW_MS = 24 * 3600 * 1000  # the idempotency window: older signed entries are replays

#: The principal of the inputs a dispatcher writes itself (a sub-agent's child session, its
#: close). They are signed with the engine's own key, which no producer holds.
ENGINE_PRINCIPAL = "parley.engine"


def engine_input_id(key: str, session: str, purpose: str) -> str:
    """The idempotency key of an input the engine writes (`purpose`: spawn, close): the same on
    every flush of the same effect, so a second flush is a duplicate, and derived from the
    engine's key, so no producer can name it first and use it up (a producer's entry with that
    id, refused or not, would make the engine's own a `duplicate`)."""
    digest = hmac.new(key.encode(), f"{purpose}\n{session}".encode(), hashlib.sha256).hexdigest()
    return f"parley-{purpose}-{digest[:32]}"


def signature(key: str, session: str, entry_id: str, ts: str, input_json: bytes) -> str:
    message = b"\n".join([session.encode(), entry_id.encode(), ts.encode(), input_json])
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


#: the field of a results-stream entry that holds the engine's signature of its outcome
ENGINE_SIG_FIELD = "engine_sig"


def outcome_signature(key: str, outcome_json: bytes) -> str:
    """The engine's signature of an outcome only a dispatcher makes (an interrupt's deadline, a
    sub-agent's report): results streams are written by workers too, and a worker must not be
    able to pose as the engine there (resume an interrupt with its default, answer a parent's
    sub-agent call). Tagged so that it can never be taken for an input's signature."""
    return hmac.new(key.encode(), b"parley-outcome\n" + outcome_json, hashlib.sha256).hexdigest()


def signed_outcome(key: str, outcome_json: bytes) -> dict[str, bytes | str]:
    """The fields of a results-stream entry of an outcome only the engine makes, signed."""
    return {"outcome": outcome_json, ENGINE_SIG_FIELD: outcome_signature(key, outcome_json)}


def engine_signed(key: str | None, outcome_json: bytes, sig: str | None) -> bool:
    """`sig` is the engine's signature of `outcome_json` by `key` (False without either)."""
    if key is None or sig is None:
        return False
    return hmac.compare_digest(outcome_signature(key, outcome_json), sig)


#: the field of a results-stream entry that holds the taker's signature of its outcome
JOB_SIG_FIELD = "job_sig"


def job_token(engine_key: str, job_id: str) -> str:
    """The secret a job's take hands its taker (docs/protocol.md, "Who may post an outcome"):
    derived from the engine's key, so a dispatcher can check an outcome without storing it, and
    no worker can compute it. It waits in the job's token key, which the take reads and deletes
    at once (GETDEL): only the worker that took the job knows it."""
    return hmac.new(engine_key.encode(), b"parley-job-token\n" + job_id.encode(), hashlib.sha256).hexdigest()


def job_outcome_signature(token: str, outcome_json: bytes) -> str:
    """A taker's signature of its job's outcome, under the job's token."""
    return hmac.new(token.encode(), b"parley-job-outcome\n" + outcome_json, hashlib.sha256).hexdigest()


def job_signed(engine_key: str | None, job_id: str, outcome_json: bytes, sig: str | None) -> bool:
    """`sig` is the signature of `outcome_json` by the worker that took job `job_id`."""
    if engine_key is None or sig is None:
        return False
    return hmac.compare_digest(job_outcome_signature(job_token(engine_key, job_id), outcome_json), sig)


def signed_fields(key: str, principal: str, session: str, entry_id: str, input_json: bytes,
                  now_ms: int | None = None) -> dict[str, str]:
    """The fields a producer adds to sign an entry."""
    ts = str(now_ms if now_ms is not None else int(time.time() * 1000))
    return {"principal": principal, "ts": ts,
            "sig": signature(key, session, entry_id, ts, input_json)}


class Unauthorized(ValueError):
    pass


#: the refusals that say the dispatcher's keys are not the signer's: it has no key for the
#: principal, or none that matches (the inbox words them as the fix: parley/web/present.py)
UNKNOWN_PRINCIPAL = "unknown principal"
BAD_SIGNATURE = "bad signature"


class KeysFileError(ValueError):
    """A keys file that cannot be used: unreadable, not JSON, or not the expected shape."""


def parse_keys(text: str | bytes, source: str = "keys file") -> dict[str, tuple[str, ...]]:
    """The principals and their keys (first: the one to sign with) of a keys file's text:
    `{principal: secret}` or `{principal: [secret, ...]}`, every secret a non-empty string and
    every list non-empty and without repeats. Anything else is a KeysFileError naming what."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KeysFileError(f"{source}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KeysFileError(f"{source}: expected a JSON object {{principal: secret or [secrets]}}")
    keys: dict[str, tuple[str, ...]] = {}
    for principal, value in data.items():
        listed = [value] if isinstance(value, str) else value
        if not principal or not isinstance(listed, list) or not listed or not all(
                isinstance(secret, str) and secret for secret in listed):
            raise KeysFileError(f"{source}: principal {principal!r}: expected a non-empty secret or a "
                                "non-empty list of non-empty secrets")
        if len(set(listed)) != len(listed):
            raise KeysFileError(f"{source}: principal {principal!r} lists one secret twice")
        keys[principal] = tuple(listed)
    if ENGINE_PRINCIPAL in keys:
        raise KeysFileError(f"{source}: {ENGINE_PRINCIPAL!r} is the dispatchers' own principal; "
                            "name producers otherwise")
    return keys


@dataclass(frozen=True)
class Keyring:
    #: principal -> its active keys, the one to sign with first
    keys: dict[str, tuple[str, ...]]
    required: bool = False
    #: the engine's key, verifying the dispatchers' own inputs (None: none are accepted)
    engine_key: str | None = None

    def __post_init__(self) -> None:
        # One key given as a plain string (`Keyring({"alice": "secret"})`) is a list of one: a
        # string must never be taken for its characters.
        keys = {p: (v,) if isinstance(v, str) else tuple(v) for p, v in self.keys.items()}
        object.__setattr__(self, "keys", keys)

    @classmethod
    def load(cls, path: str | None, required: bool = False) -> "Keyring":
        """The keyring of a keys file (none: no principal). OSError when it cannot be read,
        KeysFileError (a ValueError) when it has the wrong shape."""
        if not path:
            if required:
                raise ValueError("signing is required but no keys file is configured")
            return cls({}, required)
        return cls(parse_keys(Path(path).read_bytes(), path), required)

    def reloaded(self, path: str) -> "Keyring":
        """This keyring with the keys `path` holds now (the same `required`, the same engine's
        key); raises as `load` does, and then this keyring stays as it was."""
        return replace(self, keys=parse_keys(Path(path).read_bytes(), path))

    def with_engine_key(self, key: str) -> "Keyring":
        return replace(self, engine_key=key)

    def __repr__(self) -> str:  # never print the secrets
        return f"Keyring(principals={sorted(self.keys)}, required={self.required})"

    def secrets_of(self, principal: str | None) -> tuple[str, ...]:
        """Every key an entry of `principal` may be signed with (none: an unknown principal)."""
        if principal == ENGINE_PRINCIPAL:
            return (self.engine_key,) if self.engine_key is not None else ()
        return self.keys.get(principal, ()) if principal else ()

    def signing_key(self, principal: str) -> str | None:
        """The key to sign `principal`'s entries with: its first (during a rotation, the new one
        once it is moved first; docs/operations.md, "Rotating signing keys")."""
        secrets = self.secrets_of(principal)
        return secrets[0] if secrets else None

    def verify(self, fields: dict[bytes | str, bytes | str], now_ms: int) -> str | None:
        """The verified principal of a signed entry; None for an unsigned one when allowed."""
        def text(name: str) -> str | None:
            raw = fields.get(name.encode(), fields.get(name))
            return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw

        sig, principal = text("sig"), text("principal")
        if sig is None:
            if self.required:
                raise Unauthorized("signing is required: the entry has no `sig`")
            return None
        entry_id, ts, session = text("id"), text("ts"), text("session") or ""
        raw_input = fields.get(b"input", fields.get("input")) or b""
        input_json = raw_input if isinstance(raw_input, bytes) else raw_input.encode()
        secrets = self.secrets_of(principal)
        if not secrets:
            raise Unauthorized(UNKNOWN_PRINCIPAL)
        if not entry_id:
            raise Unauthorized("a signed entry needs an `id`")
        if ts is None or not (ts.isascii() and ts.isdigit() and len(ts) <= 16):
            raise Unauthorized("a signed entry needs `ts`, Unix milliseconds")
        if abs(now_ms - int(ts)) > WINDOW_MS:
            raise Unauthorized("the entry is older than the idempotency window (or from the future)")
        # Every listed key is tried (no early exit), so how long a check takes says nothing of
        # which key, if any, matched.
        matches = [hmac.compare_digest(signature(secret, session, entry_id, ts, input_json), sig)
                   for secret in secrets]
        if not any(matches):
            raise Unauthorized(BAD_SIGNATURE)
        return principal
