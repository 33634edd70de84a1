"""Who may sign in to the inbox: a users file, and checking a secret against it (pure).

The file is JSON, `{principal: {"password": "<scrypt hash>"}}` or `{principal: {"token_sha256":
"<hex>"}}` (a long random token, for people who sign in with a password manager or for
automation), written by `parley inbox-user` (parley/cli/inbox_users.py). The principals are
the ones of the signing keys file: signing in as `alice` is what lets the page sign resumes
with alice's key. No secret is ever stored in the clear, logged, or shown.

A password hash is self-describing, `scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>`, so stronger
parameters can be used later without a format change. The parameters are read from the file,
so they are bounded when it is parsed: a hostile or mistyped file must not make each sign-in
cost minutes of CPU or gigabytes of memory.
"""

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.schemas.signing import ENGINE_PRINCIPAL


class UsersFileError(ValueError):
    """A users file that cannot be used: unreadable, not JSON, or not the expected shape."""


#: the parameters `hash_password` uses: about 16 MiB and a few tens of ms per hash
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32

# The bounds a stored hash's parameters must keep. `n * r * p` is the work (the default is
# 2**17) and `128 * n * r` the memory; 16 times the default's work and 256 MiB of memory is
# the most one check may cost.
MAX_N = 2**20
MAX_R = 32
MAX_P = 16
MAX_WORK = 2**21
MAX_MEMORY = 2**28
# hashlib.scrypt refuses to use more than `maxmem` (default 32 MiB); OpenSSL needs a little
# over 128 * n * r, so the cap leaves room above MAX_MEMORY.
_MAXMEM = MAX_MEMORY + 2**24
SALT_RANGE = (8, 64)
HASH_RANGE = (16, 64)

#: the keys of an entry, one of them exactly
PASSWORD = "password"
TOKEN = "token_sha256"
# How a token's digest is kept in `Users.credentials` (a password hash starts with "scrypt$").
_TOKEN_PREFIX = "sha256$"


@dataclass(frozen=True)
class ScryptHash:
    """A parsed `scrypt$...` string: its parameters, salt and derived key."""
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        b64 = base64.b64encode
        return (f"scrypt${self.n}${self.r}${self.p}$"
                f"{b64(self.salt).decode()}${b64(self.digest).decode()}")

    def derive(self, secret: str) -> bytes:
        """The key `secret` derives with this hash's parameters and salt."""
        return hashlib.scrypt(secret.encode("utf-8"), salt=self.salt, n=self.n, r=self.r,
                              p=self.p, maxmem=_MAXMEM, dklen=len(self.digest))

    @classmethod
    def parse(cls, text: str) -> "ScryptHash":
        """The hash `text` encodes; ValueError naming what is wrong (never echoing the text)."""
        parts = text.split("$")
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError("expected scrypt$<n>$<r>$<p>$<salt base64>$<hash base64>")
        try:
            n, r, p = (int(part, 10) for part in parts[1:4])
        except ValueError:
            raise ValueError("the scrypt parameters n, r and p must be integers") from None
        if not (2 <= n <= MAX_N and n & (n - 1) == 0):
            raise ValueError(f"scrypt n={n}: expected a power of two from 2 to {MAX_N}")
        if not 1 <= r <= MAX_R:
            raise ValueError(f"scrypt r={r}: expected 1 to {MAX_R}")
        if not 1 <= p <= MAX_P:
            raise ValueError(f"scrypt p={p}: expected 1 to {MAX_P}")
        if n * r * p > MAX_WORK or 128 * n * r > MAX_MEMORY:
            raise ValueError(f"scrypt n={n}, r={r}, p={p} costs too much per check (at most "
                             f"n*r*p = {MAX_WORK} and 128*n*r = {MAX_MEMORY} bytes)")
        salt, digest = _b64(parts[4], "salt", SALT_RANGE), _b64(parts[5], "hash", HASH_RANGE)
        return cls(n, r, p, salt, digest)


def _b64(text: str, what: str, size: tuple[int, int]) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the scrypt {what} is not base64") from None
    if not size[0] <= len(raw) <= size[1]:
        raise ValueError(f"the scrypt {what} has {len(raw)} bytes (expected {size[0]} to {size[1]})")
    return raw


def hash_password(password: str) -> str:
    """A self-describing scrypt hash of `password` (a fresh random salt each time)."""
    if not password:
        raise ValueError("an empty password cannot be hashed")
    salt = secrets.token_bytes(SALT_BYTES)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R,
                            p=SCRYPT_P, maxmem=_MAXMEM, dklen=HASH_BYTES)
    return ScryptHash(SCRYPT_N, SCRYPT_R, SCRYPT_P, salt, digest).encode()


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a token, the form a users file keeps it in. A token is long and
    random (`parley inbox-user --token`), so a fast digest is enough: nothing can be guessed."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_credential(token: str) -> str:
    """The credential (`Users.credentials`' value) of a token entry."""
    return _TOKEN_PREFIX + token_sha256(token)


# Checked against for a principal without a password (unknown, or signing in with a token), so
# every check costs one scrypt with the default parameters, and the time it takes tells nobody
# who exists or how they sign in. Its salt is fixed: nothing is ever meant to match it.
_DUMMY = ScryptHash(SCRYPT_N, SCRYPT_R, SCRYPT_P, b"parley-no-user!!", b"\0" * HASH_BYTES)


def check_principal(principal: Any) -> str:
    """`principal` when it can be one (ValueError otherwise): a non-empty printable string,
    and not the dispatchers' own."""
    if not isinstance(principal, str) or not principal:
        raise ValueError("a principal is a non-empty string")
    if not principal.isprintable() or principal != principal.strip():
        raise ValueError("a principal has no control characters, and no spaces at either end")
    if principal == ENGINE_PRINCIPAL:
        raise ValueError(f"{ENGINE_PRINCIPAL!r} is the dispatchers' own principal; nobody signs "
                         "in as it")
    return principal


def _credential_of(entry: Any) -> str:
    """The credential of one entry of the file (ValueError saying what is wrong)."""
    if not isinstance(entry, dict):
        raise ValueError(f'expected an object, {{"{PASSWORD}": ...}} or {{"{TOKEN}": ...}}')
    unknown = sorted(set(entry) - {PASSWORD, TOKEN})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))} (expected "
                         f"{PASSWORD!r} or {TOKEN!r})")
    if len(entry) != 1:
        raise ValueError(f"expected exactly one of {PASSWORD!r} or {TOKEN!r}, not "
                         f"{'both' if entry else 'neither'}")
    if PASSWORD in entry:
        if not isinstance(entry[PASSWORD], str):
            raise ValueError(f"{PASSWORD!r} must be a string (a hash `parley inbox-user` writes)")
        return ScryptHash.parse(entry[PASSWORD]).encode()
    digest = entry[TOKEN]
    if not (isinstance(digest, str) and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest.lower())):
        raise ValueError(f"{TOKEN!r} must be a SHA-256 digest: 64 hex digits")
    return _TOKEN_PREFIX + digest.lower()


def _entry_of(credential: str) -> dict[str, str]:
    """The file's form of a credential (the inverse of `_credential_of`)."""
    if credential.startswith(_TOKEN_PREFIX):
        return {TOKEN: credential[len(_TOKEN_PREFIX):]}
    return {PASSWORD: credential}


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of repeated keys: a principal listed twice is refused instead,
    # as its first entry would be silently ignored.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise UsersFileError(f"{key!r} appears twice in one object")
        out[key] = value
    return out


@dataclass(frozen=True)
class Users:
    #: principal -> its stored credential: a password hash (`scrypt$...`) or a token digest
    #: (`sha256$<hex>`); every one checked when the value is made, so `check` never meets a
    #: malformed one
    credentials: dict[str, str]

    def __post_init__(self) -> None:
        for principal, credential in self.credentials.items():
            try:
                check_principal(principal)
                entry = _entry_of(credential)
                _credential_of(entry)
            except ValueError as exc:
                raise UsersFileError(f"principal {principal!r}: {exc}") from None

    @classmethod
    def parse(cls, text: str | bytes, source: str = "users file") -> "Users":
        """The users of a users file's text; a UsersFileError naming the principal and what is
        wrong with its entry otherwise (a file naming nobody is one: nobody could sign in)."""
        try:
            data = json.loads(text, object_pairs_hook=_no_repeats)
        except UsersFileError as exc:
            raise UsersFileError(f"{source}: {exc}") from None
        except ValueError as exc:  # not JSON, or not UTF-8
            raise UsersFileError(f"{source}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise UsersFileError(f"{source}: expected a JSON object {{principal: "
                                 f'{{"{PASSWORD}": hash}} or {{"{TOKEN}": hex}}}}')
        if not data:
            raise UsersFileError(f"{source}: names nobody, so nobody could sign in (add people "
                                 "with `parley inbox-user`)")
        credentials: dict[str, str] = {}
        for principal, entry in data.items():
            try:
                check_principal(principal)
                credentials[principal] = _credential_of(entry)
            except ValueError as exc:
                raise UsersFileError(f"{source}: principal {principal!r}: {exc}") from None
        return cls(credentials)

    @classmethod
    def load(cls, path: str) -> "Users":
        """The users of the file at `path`: OSError when it cannot be read, UsersFileError (a
        ValueError) when it has the wrong shape."""
        return cls.parse(Path(path).read_bytes(), path)

    def with_credential(self, principal: str, credential: str) -> "Users":
        """These users with `principal`'s entry added or replaced (`hash_password(...)` or
        `token_credential(...)`); UsersFileError when either cannot be used."""
        return Users({**self.credentials, principal: credential})

    def to_json(self) -> bytes:
        """The users file's text (principals sorted, so a rewrite changes one entry's lines)."""
        entries = {p: _entry_of(c) for p, c in sorted(self.credentials.items())}
        return (json.dumps(entries, indent=2) + "\n").encode()

    def check(self, principal: str, secret: str) -> bool:
        """Whether `secret` is `principal`'s password or token. Costs the same for an unknown
        principal (a hash is computed anyway), and compares in constant time."""
        credential = self.credentials.get(principal)
        given = secret if isinstance(secret, str) else ""
        if credential is None or credential.startswith(_TOKEN_PREFIX):
            _DUMMY.derive(given)
            if credential is None or not given:
                return False
            return hmac.compare_digest(token_credential(given).encode(), credential.encode())
        derived = ScryptHash.parse(credential)
        # an empty secret costs a hash like any other, and never matches
        return hmac.compare_digest(derived.derive(given), derived.digest) and bool(given)

    def __repr__(self) -> str:  # never print the hashes
        return f"Users(principals={sorted(self.credentials)})"
