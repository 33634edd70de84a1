"""The producer registry: who may write inputs, and into which tenant's sessions.

Each registered producer writes only input streams of its own (`parley:in:<name>[:<p>]`,
schemas/keys.py), which dispatchers read besides the engine's own. A registration is JSON in
the `parley:producers` hash, keyed by the producer's name (docs/operations.md, "Producers").
Pure: no Redis here; the CLI and the dispatcher read and write the hash.
"""

import re
import time
from typing import Annotated

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parley.schemas.ids import TENANT_RE, tenant_of

# No colon (`parley:in:<name>:*` must match only that producer's own streams), no glob
# character (ACL key patterns name it), lowercase so two names never differ by case alone.
PRODUCER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


class ProducerError(ValueError):
    """A name, tenant or stored registration that cannot be used, with the reason."""


class Producer(BaseModel):
    """One producer's registration: its name, the tenant it is scoped to (None: any session),
    and when it was added (Unix ms)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, Field(pattern=PRODUCER_NAME_RE.pattern)]
    tenant: Annotated[str | None, Field(pattern=TENANT_RE.pattern)] = None
    added_at: int = 0

    def allows(self, session: str) -> bool:
        """A scoped producer writes only its tenant's sessions (`<tenant>/...`); an unscoped
        one writes any session."""
        return self.tenant is None or tenant_of(session) == self.tenant

    def to_json(self) -> bytes:
        """The registration as stored: the name is the hash field, not repeated in the value."""
        return orjson.dumps({"tenant": self.tenant, "added_at": self.added_at})


def check_name(name: str) -> str:
    if not PRODUCER_NAME_RE.fullmatch(name):
        raise ProducerError(f"{name!r} is not a producer name: 1 to 32 of a-z 0-9 _ -, "
                            "starting with a letter or digit")
    return name


def check_tenant(tenant: str | None) -> str | None:
    if tenant is not None and not TENANT_RE.fullmatch(tenant):
        raise ProducerError(f"{tenant!r} is not a tenant: 1 to 64 of A-Z a-z 0-9 . _ -")
    return tenant


def new_producer(name: str, tenant: str | None, now_ms: int | None = None) -> Producer:
    """A registration to add, its name and tenant checked (ProducerError says why not)."""
    return Producer(name=check_name(name), tenant=check_tenant(tenant),
                    added_at=int(time.time() * 1000) if now_ms is None else now_ms)


def parse_registration(spec: str, now_ms: int | None = None) -> Producer:
    """A registration from the dispatcher's `--register-producer NAME[=TENANT]` (ProducerError
    says why not)."""
    name, _sep, tenant = spec.partition("=")
    return new_producer(name, tenant or None, now_ms)


def parse_producer(name: bytes | str, raw: bytes | str) -> Producer:
    """A stored registration (a field and value of the hash); ProducerError when it is not one."""
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
    try:
        value = orjson.loads(raw)
        if not isinstance(value, dict):
            raise ProducerError(f"producer {text!r}: its registration is not a JSON object")
        return Producer(name=text, tenant=value.get("tenant"), added_at=value.get("added_at", 0))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise ProducerError(f"producer {text!r}: unusable registration: {exc}") from None


def parse_registry(raw: dict[bytes, bytes] | dict[str, str]) -> tuple[dict[str, Producer], list[str]]:
    """Every usable registration of the hash by name, and the errors of those that are not
    (reported, never fatal: one bad field must not stop the reading of every other producer)."""
    producers: dict[str, Producer] = {}
    errors: list[str] = []
    for name, value in raw.items():
        try:
            p = parse_producer(name, value)
        except ProducerError as exc:
            errors.append(str(exc))
            continue
        producers[p.name] = p
    return producers, errors


def acl_line(name: str, tenant: str | None, prefix: str = "parley", password: str = "change-me") -> str:
    """The users.acl line of a producer login (deploy/redis/users.acl): it may read the limits
    and sessions' meta (its tenant's only, when scoped); call the submit function on its own
    three keys (FCALL needs read-write access to the keys it declares, in one selector); XADD to
    its own input streams only, and HGET/HINCRBY its own pending hash only (Redis checks every
    command the function runs against the caller's login). One selector per key type: with
    XADD on the pending hash, or HINCRBY on a stream key, the producer could give one of its
    keys the wrong type and make a dispatcher's command on it fail (docs/operations.md,
    "Producers and their logins"). And read sessions' events (its tenant's only). WAIT: a careful
    producer asks a replica to hold its input before counting it sent (docs/operations.md,
    "Failover without loss")."""
    check_name(name)
    check_tenant(tenant)
    sessions = f"{prefix}:{{{tenant}/*}}" if tenant is not None else f"{prefix}:{{*}}"
    own = f"{prefix}:in:{name}"
    pending = f"~{prefix}:pending:{name}"
    return (f"user {prefix}-producer-{name} on >{password} resetkeys resetchannels -@all +ping +select +wait "
            f"+hget +hmget %R~{prefix}:config %R~{sessions}:meta "
            f"(+fcall ~{own} ~{own}:* {pending}) (+xadd ~{own} ~{own}:*) (+hget +hincrby {pending}) "
            f"(+xread +xrange +xrevrange %R~{sessions}:events %R~{sessions}:deltas)")
