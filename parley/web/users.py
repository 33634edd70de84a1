"""Who may sign in to the inbox: a users file, and checking a secret against it (pure).

The file is JSON, `{principal: {"password": "<scrypt hash>"}}` or `{principal: {"token_sha256":
"<hex>"}}` (a long random token, for people who sign in with a password manager or for
automation), written by `parley inbox-user` (parley/cli/inbox_users.py). The principals are
the ones of the signing keys file: signing in as `alice` is what lets the page sign resumes
with alice's key. No secret is ever stored in the clear, logged, or shown.
"""

from dataclasses import dataclass


class UsersFileError(ValueError):
    """A users file that cannot be used: unreadable, not JSON, or not the expected shape."""


def hash_password(password: str) -> str:
    """A self-describing scrypt hash of `password` (a fresh random salt each time)."""
    raise NotImplementedError


@dataclass(frozen=True)
class Users:
    #: principal -> its stored credential (a password hash or a token digest)
    credentials: dict[str, str]

    @classmethod
    def parse(cls, text: str | bytes, source: str = "users file") -> "Users":
        raise NotImplementedError

    @classmethod
    def load(cls, path: str) -> "Users":
        raise NotImplementedError

    def check(self, principal: str, secret: str) -> bool:
        """Whether `secret` is `principal`'s password or token. Costs the same for an unknown
        principal (a hash is computed anyway), and compares in constant time."""
        raise NotImplementedError

    def __repr__(self) -> str:  # never print the hashes
        return f"Users(principals={sorted(self.credentials)})"
