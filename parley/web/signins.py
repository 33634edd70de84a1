"""Sign-ins to the inbox, kept in Redis so that signing out, a changed password and a removed
person end them everywhere at once.

The cookie (signed, HttpOnly) carries only a random sign-in id. The record
`<prefix>:inbox:signin:<id>` on the first shard holds the principal and a fingerprint of the
credential they signed in with, and expires with the sign-in. A request counts as signed in
only while the record exists, names the cookie's principal, and its fingerprint matches the
principal's credential in the users file now: a sign-out deletes the record, and a new
password or token (or a removal from the file) no longer matches. Every replica of the page
reads the same records, so this holds behind a load balancer.
"""

import hashlib
import secrets
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis

from parley.schemas.keys import Keys


def new_signin_id() -> str:
    return secrets.token_urlsafe(24)


def fingerprint(credential: str) -> str:
    """A short digest of a stored credential (already a hash): tells a changed password apart
    without keeping the hash itself in Redis."""
    return hashlib.sha256(b"parley-inbox-signin\n" + credential.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SignIn:
    principal: str
    credential: str  # its fingerprint

    def to_json(self) -> bytes:
        return orjson.dumps({"principal": self.principal, "credential": self.credential})

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> "SignIn | None":
        """The record's sign-in; None for no record or one that cannot be read."""
        if raw is None:
            return None
        try:
            data = orjson.loads(raw)
            return cls(str(data["principal"]), str(data["credential"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None

    def holds(self, principal: str, credentials: dict[str, str]) -> bool:
        """Whether this sign-in is still good for `principal` given the users file now."""
        current = credentials.get(principal)
        return (self.principal == principal and current is not None
                and secrets.compare_digest(self.credential, fingerprint(current)))


class SignIns:
    """The records, on one Redis (the first shard)."""

    def __init__(self, redis: Redis, keys: Keys, max_age_s: int):
        self.redis, self.keys, self.max_age_s = redis, keys, max_age_s

    async def start(self, principal: str, credential: str) -> str:
        sid = new_signin_id()
        record = SignIn(principal, fingerprint(credential)).to_json()
        await self.redis.set(self.keys.inbox_signin(sid), record, ex=self.max_age_s)
        return sid

    async def find(self, sid: str) -> SignIn | None:
        return SignIn.from_json(await self.redis.get(self.keys.inbox_signin(sid)))

    async def end(self, sid: str) -> None:
        await self.redis.delete(self.keys.inbox_signin(sid))
