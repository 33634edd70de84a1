"""Fingerprints of the signing keys dispatchers verify with, and a signer's own keys compared
with them. Pure: dispatcher/keyprints.py writes them, parley/web/keycheck.py reads them.

The inbox signs each answer with the signed-in person's key from its own keys file. A
dispatcher given another file (or none) refuses every such answer `unauthorized: unknown
principal`, and nothing said why. So each dispatcher publishes, in its shard's
`parley:keyprints` (a hash: dispatcher name -> `Keyprints` JSON), a fingerprint of each key of
each principal it verifies with, at its start and whenever it reads its keys file again; the
inbox compares its own keys with them at start and says, one line per problem, what to fix
(docs/inbox.md, "The keys file").

A fingerprint is the first 16 hex digits of HMAC-SHA256, keyed with the fixed tag
`parley-key-fingerprint`, of the principal and the key: one principal's equal keys give equal
fingerprints, two principals sharing a key do not show it, and a fingerprint signs nothing and
gives no key back. Like any hash of a secret, it lets whoever reads it test guesses of a weak
key offline, and the logins that may read it (the dispatchers', the inbox's, the AG-UI
endpoint's) see every principal's, not only their own: a key must be long and random (32 random
bytes, as `openssl rand -hex 32` makes), so that no guess can find it. A slow hash would not
change that for a good key, and would cost each dispatcher seconds at every start with many
principals.
"""

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

FINGERPRINT_TAG = b"parley-key-fingerprint"
#: 64 bits: two different keys of one principal never look alike by chance
FINGERPRINT_HEX = 16


def fingerprint(principal: str, secret: str) -> str:
    """The fingerprint of one of `principal`'s keys (the principal is in it, so that two
    principals with the same key get different fingerprints)."""
    message = principal.encode() + b"\n" + secret.encode()
    return hmac.new(FINGERPRINT_TAG, message, hashlib.sha256).hexdigest()[:FINGERPRINT_HEX]


class Keyprints(BaseModel):
    """What one dispatcher published: when (Unix ms), and the fingerprints of each principal's
    keys, in its keys file's order (the one producers sign with first)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    at: int
    principals: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, keys: Mapping[str, Sequence[str]], at_ms: int) -> "Keyprints":
        """The fingerprints of a keyring's keys (`Keyring.keys`: principal -> its keys)."""
        return cls(at=at_ms, principals={p: tuple(fingerprint(p, s) for s in secrets)
                                         for p, secrets in keys.items()})

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


@dataclass(frozen=True)
class Published:
    """One dispatcher's record in `parley:keyprints`."""

    dispatcher: str
    prints: Keyprints


@dataclass(frozen=True)
class PublishedKeys:
    """One shard's `parley:keyprints`, read."""

    records: tuple[Published, ...] = ()
    #: dispatchers whose record is not a `Keyprints` (a newer release's, or written by hand)
    unreadable: tuple[str, ...] = ()


def text_of(raw: bytes | str) -> str:
    """A reply's bytes as text (a dispatcher's name, a field)."""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def read_published(fields: Mapping[Any, bytes | str]) -> PublishedKeys:
    """The records of a `parley:keyprints` hash (HGETALL), in dispatcher order; a field that
    does not parse is named in `unreadable` rather than failing the whole read."""
    records, unreadable = [], []
    for name, raw in sorted((text_of(k), v) for k, v in fields.items()):
        try:
            records.append(Published(name, Keyprints.model_validate_json(raw)))
        except ValidationError:
            unreadable.append(name)
    return PublishedKeys(tuple(records), tuple(unreadable))


def departed(published: PublishedKeys, registered: Mapping[str, float], now_ms: int,
             grace_ms: int) -> list[str]:
    """The records to delete: of dispatchers that stopped registering as live (`registered`:
    name -> its last registration in `parley:dispatchers`, Unix ms) more than `grace_ms` ago,
    and published more than `grace_ms` ago (a dispatcher publishes before it first registers).
    A record nobody can read is left alone: a newer dispatcher may have written it."""
    cutoff = now_ms - grace_ms
    return [r.dispatcher for r in published.records
            if registered.get(r.dispatcher, float("-inf")) < cutoff and r.prints.at < cutoff]


class KeyTrouble(StrEnum):
    #: no dispatcher of the shard has published its keys (an older release, or none running)
    NOTHING_PUBLISHED = "nothing_published"
    #: `parley:keyprints` could not be read (a login without the grant, Redis down)
    NOT_READ = "not_read"
    #: a dispatcher's record cannot be read
    UNREADABLE = "unreadable"
    #: every dispatcher that published verifies no key at all (started without --keys-file)
    NO_KEYS = "no_keys"
    #: the principal is not in these dispatchers' keys
    UNKNOWN = "unknown"
    #: it is, but without the key the signer signs with (its first for that principal)
    DIFFERS = "differs"


@dataclass(frozen=True)
class KeyProblem:
    """One thing that makes the dispatchers refuse what the signer signs; `describe` words it."""

    trouble: KeyTrouble
    principal: str | None = None
    #: the dispatchers it holds for (UNKNOWN, DIFFERS, UNREADABLE)
    dispatchers: tuple[str, ...] = ()
    #: how many dispatchers published a readable record
    published: int = 0
    #: of `dispatchers`, those that verify no key at all
    keyless: tuple[str, ...] = ()
    #: the shard (None: a deployment of one Redis)
    shard: int | None = None
    #: NOT_READ: the error, and what to do about it
    detail: str | None = None


@dataclass(frozen=True)
class Signer:
    """Who compares its keys, as the lines name it, and how it is given the dispatchers' keys."""

    name: str
    #: what to do when the dispatchers lack its key for `{principal}`
    fix: str


INBOX = Signer("inbox", "start them with the same --keys-file (or add {principal}'s key to theirs)")
AGUI = Signer("agui", "add {principal}'s key (parley agui's --signing-key) to their --keys-file")


def compare_keys(signer: Mapping[str, Sequence[str]], found: PublishedKeys,
                 shard: int | None = None) -> list[KeyProblem]:
    """What stops the dispatchers that published `found` from verifying what `signer` signs
    (principal -> its keys, the one it signs with first). A principal is fine when every
    dispatcher has its first key: a rotation under way on either side (other keys differing)
    refuses nothing. Empty when the signer has no key to sign with: there is nothing to check."""
    principals = sorted(p for p, secrets in signer.items() if secrets)
    if not principals:
        return []
    problems = [KeyProblem(KeyTrouble.UNREADABLE, dispatchers=(name,), shard=shard)
                for name in found.unreadable]
    records, n = found.records, len(found.records)
    if not records:
        return [*problems, KeyProblem(KeyTrouble.NOTHING_PUBLISHED, shard=shard)]
    keyless = tuple(r.dispatcher for r in records if not r.prints.principals)
    if len(keyless) == n:
        return [*problems, KeyProblem(KeyTrouble.NO_KEYS, dispatchers=keyless, published=n, shard=shard)]
    for principal in principals:
        first = fingerprint(principal, signer[principal][0])
        theirs = {r.dispatcher: r.prints.principals.get(principal) for r in records}
        unknown = tuple(d for d, prints in theirs.items() if prints is None)
        differs = tuple(d for d, prints in theirs.items() if prints is not None and first not in prints)
        if unknown:
            problems.append(KeyProblem(KeyTrouble.UNKNOWN, principal, unknown, n,
                                       tuple(d for d in unknown if d in keyless), shard))
        if differs:
            problems.append(KeyProblem(KeyTrouble.DIFFERS, principal, differs, n, shard=shard))
    return problems


def _whom(problem: KeyProblem) -> str:
    """`the dispatchers`, or `1 of the 2 dispatchers (d-1)`, of the shard when there are several."""
    of = "" if problem.shard is None else f" of shard {problem.shard}"
    if len(problem.dispatchers) >= problem.published:
        return f"the dispatchers{of}"
    return (f"{len(problem.dispatchers)} of the {problem.published} dispatchers{of} "
            f"({', '.join(problem.dispatchers)})")


def describe(problem: KeyProblem, signer: Signer = INBOX) -> str:
    """One line for the operator: what is wrong, and what to do."""
    on = "" if problem.shard is None else f" on shard {problem.shard}"
    fix = signer.fix.format(principal=problem.principal)
    match problem.trouble:
        case KeyTrouble.NOTHING_PUBLISHED:
            return (f"no dispatcher has published its keys{on} (older dispatchers, or none running): "
                    f"the {signer.name}'s keys cannot be checked against theirs")
        case KeyTrouble.NOT_READ:
            return (f"the dispatchers' published keys could not be read{on} ({problem.detail}): "
                    f"the {signer.name}'s keys are not checked against theirs")
        case KeyTrouble.UNREADABLE:
            return (f"dispatcher {problem.dispatchers[0]}'s published keys{on} cannot be read (a newer "
                    "release?): not compared")
        case KeyTrouble.NO_KEYS:
            return (f"{_whom(problem)} verify no signing key at all (started without --keys-file?): "
                    f"they refuse every answer the {signer.name} signs; start them with the same "
                    "--keys-file")
        case KeyTrouble.UNKNOWN:
            keyless = ""
            if problem.keyless:
                one = len(problem.keyless) == 1
                who = (("it" if one else "they") if problem.keyless == problem.dispatchers
                       else ", ".join(problem.keyless))
                verify = "verifies" if one else "verify"
                keyless = f" ({who} {verify} no key at all: started without --keys-file?)"
            return f"{signer.name} key for {problem.principal} is unknown to {_whom(problem)}{keyless}: {fix}"
    return (f"{signer.name} key for {problem.principal} (its first, which it signs with) is not one "
            f"{_whom(problem)} have for {problem.principal}: {fix}")


def summary(signer: Mapping[str, Sequence[str]], found: Sequence[PublishedKeys], who: Signer = INBOX) -> str:
    """The line logged when nothing is wrong."""
    principals = sum(1 for secrets in signer.values() if secrets)
    dispatchers = sum(len(f.records) for f in found)
    return (f"{who.name} keys checked: the {dispatchers} dispatcher(s) that published theirs have the "
            f"key the {who.name} signs with for each of its {principals} principal(s)")
