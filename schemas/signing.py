"""Signed inputs (docs/protocol.md, Signing): HMAC-SHA256 over `session\\nid\\nts\\ninput`, per principal.

Keys come from a JSON file `{principal: secret}` named by the dispatcher's configuration;
they are never logged and never appear in events.

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


def signature(key: str, session: str, entry_id: str, ts: str, input_json: bytes) -> str:
    message = b"\n".join([session.encode(), entry_id.encode(), ts.encode(), input_json])
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def signed_fields(key: str, principal: str, session: str, entry_id: str, input_json: bytes,
                  now_ms: int | None = None) -> dict[str, str]:
    """The fields a producer adds to sign an entry."""
    ts = str(now_ms if now_ms is not None else int(time.time() * 1000))
    return {"principal": principal, "ts": ts,
            "sig": signature(key, session, entry_id, ts, input_json)}


class Unauthorized(ValueError):
    pass


@dataclass(frozen=True)
class Keyring:
    keys: dict[str, str]
    required: bool = False
    #: the engine's key, verifying the dispatchers' own inputs (None: none are accepted)
    engine_key: str | None = None

    @classmethod
    def load(cls, path: str | None, required: bool = False) -> "Keyring":
        if not path:
            if required:
                raise ValueError("signing is required but no keys file is configured")
            return cls({}, required)
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()):
            raise ValueError(f"{path}: expected a JSON object {{principal: secret}}")
        if ENGINE_PRINCIPAL in data:
            raise ValueError(f"{path}: {ENGINE_PRINCIPAL!r} is the dispatchers' own principal; "
                             "name producers otherwise")
        return cls(dict(data), required)

    def with_engine_key(self, key: str) -> "Keyring":
        return replace(self, engine_key=key)

    def __repr__(self) -> str:  # never print the secrets
        return f"Keyring(principals={sorted(self.keys)}, required={self.required})"

    def secret_of(self, principal: str | None) -> str | None:
        if principal == ENGINE_PRINCIPAL:
            return self.engine_key
        return self.keys.get(principal) if principal else None

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
        secret = self.secret_of(principal)
        if secret is None:
            raise Unauthorized("unknown principal")
        if not entry_id:
            raise Unauthorized("a signed entry needs an `id`")
        if ts is None or not (ts.isascii() and ts.isdigit() and len(ts) <= 16):
            raise Unauthorized("a signed entry needs `ts`, Unix milliseconds")
        if abs(now_ms - int(ts)) > WINDOW_MS:
            raise Unauthorized("the entry is older than the idempotency window (or from the future)")
        expected = signature(secret, session, entry_id, ts, input_json)
        if not hmac.compare_digest(expected, sig):
            raise Unauthorized("bad signature")
        return principal
