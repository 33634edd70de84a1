"""What `parley inbox` is started with (its CLI options, docs/inbox.md)."""

import ipaddress
from dataclasses import dataclass, field

#: rows of the list per page
DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True)
class InboxConfig:
    #: the deployment's Redis URLs, one per shard, in the deployment's order
    redis_urls: tuple[str, ...]
    #: the people who may sign in: a users file (parley/web/users.py)
    users_file: str
    #: the principals' signing keys, the dispatchers' `--keys-file` (schemas/signing.py): the
    #: page signs each resume with the signed-in principal's first key
    keys_file: str | None = None
    prefix: str = "parley"
    #: the producer the page submits as (None: the shared streams, one Redis, no ACLs)
    producer: str | None = None
    #: signs the session cookie; replicas of the page behind one address must share it
    #: (None: a random secret per process, so a restart signs everyone out)
    session_secret: str | None = None
    #: how long a signed-in session lasts
    session_max_age_s: int = 12 * 3600
    #: the cookie is sent over HTTPS only (`secure_cookies_for` picks it from the address)
    secure_cookies: bool = True
    page_size: int = DEFAULT_PAGE_SIZE
    #: how long an answer waits for the engine to say what became of it
    resume_timeout_s: float = 10.0
    #: extra fields kept for tests and embedding
    extra: dict[str, str] = field(default_factory=dict)


def is_loopback(host: str) -> bool:
    """`host` (an address or a name to listen on) is this machine only: no other machine can
    reach the page, so plain HTTP there crosses no network."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def secure_cookies_for(host: str, choice: bool | None) -> bool:
    """Whether the sign-in cookie is marked Secure (HTTPS only): as chosen, or by default on,
    except when the page listens on loopback only, where it is served as plain HTTP to a
    browser on the same machine. Anywhere else the page is meant to sit behind TLS, and a cookie
    that could travel in clear text would let anyone on the way sign in as the approver."""
    return choice if choice is not None else not is_loopback(host)
