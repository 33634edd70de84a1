"""What `parley doctor` concludes about a Redis server from what the server says of itself.

Pure: the shell (parley/cli/doctor.py) asks Redis (`ACL GETUSER default`, `CONFIG GET`, `INFO`)
and hands the answers here as `ServerFacts`; each rule turns them into `Finding`s. A fact the
login may not read is None, and its finding says so instead of guessing.

The rule with teeth is the default user's. Redis (7.0.15 checked; redis/redis#14541, valkey
#3983) replays the AOF at start on a client that runs as the default user and re-checks every
MULTI/EXEC against that user's rights. Each Lua script that wrote more than one command is
stored in the AOF as such a transaction, so a default user that may not run everything on
every key makes a restart skip those transitions (a `== CRITICAL ==` log line each) while the
single writes around them load: acknowledged transitions lost, half-applied sessions. `off`
keeps anyone from logging in as it; the rights must stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: the default user's line that Redis can replay an AOF with, and nobody can log in as
SAFE_DEFAULT_USER = "user default off resetpass ~* &* +@all"


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    check: str
    text: str


@dataclass(frozen=True, slots=True)
class DefaultUser:
    """The parts of `ACL GETUSER default` the replay depends on, as Redis prints them."""

    commands: str  # e.g. "+@all", "-@all"
    keys: str  # e.g. "~*", "" (none)
    channels: str  # e.g. "&*", ""

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> DefaultUser:
        """From redis-py's `acl_getuser`, which splits Redis's command rules into `categories`
        (`+@all`) and `commands` (`-debug`), and gives keys and channels as lists."""
        def text(value: Any) -> str:
            if isinstance(value, list | tuple):
                return " ".join(text(v) for v in value)
            return value.decode() if isinstance(value, bytes) else str(value or "")

        rules = " ".join(t for t in (text(reply.get("categories")), text(reply.get("commands"))) if t)
        return cls(rules, text(reply.get("keys")), text(reply.get("channels")))


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What one Redis said; None: the login may not ask (or the server does not say)."""

    name: str  # how the report names the server (its URL, password masked)
    version: str | None = None
    cluster_enabled: bool | None = None
    default_user: DefaultUser | None = None
    appendonly: str | None = None
    appendfsync: str | None = None
    maxmemory_policy: str | None = None


def replays_every_transaction(user: DefaultUser) -> bool:
    """Whether the AOF's MULTI/EXEC blocks all pass the re-check under `user`'s rights: every
    command (`+@all` and nothing taken away) on every key and every channel."""
    commands = user.commands.split()
    return (commands[:1] == ["+@all"] and not any(c.startswith("-") for c in commands)
            and "~*" in user.keys.split() and "&*" in user.channels.split())


def default_user_finding(user: DefaultUser | None) -> Finding:
    check = "default user"
    if user is None:
        return Finding(Level.UNKNOWN, check, "not read (this login may not run ACL GETUSER, or the "
                       "server has no ACL): run `parley doctor` with an admin login to check that "
                       "Redis can replay its AOF")
    if replays_every_transaction(user):
        return Finding(Level.OK, check, "may run every command on every key: the AOF replays whole")
    return Finding(Level.FAIL, check,
                   f"rights `{user.commands or '-'}` keys `{user.keys or '-'}` channels "
                   f"`{user.channels or '-'}`: Redis replays the AOF as the default user and skips "
                   f"every MULTI/EXEC it may not run, so a restart loses transitions. Make its ACL "
                   f"line `{SAFE_DEFAULT_USER}` (still off: nobody can log in as it), then ACL LOAD")


def persistence_findings(facts: ServerFacts) -> list[Finding]:
    found: list[Finding] = []
    if facts.appendonly is None:
        found.append(Finding(Level.UNKNOWN, "appendonly", "not read (this login may not run CONFIG "
                             "GET): run `parley doctor` with an admin login"))
    elif facts.appendonly != "yes":
        found.append(Finding(Level.FAIL, "appendonly", f"{facts.appendonly}: a restart loses every "
                             "session; set `appendonly yes` (deploy/redis/redis.conf)"))
    else:
        found.append(Finding(Level.OK, "appendonly", "yes"))
    if facts.appendfsync is not None and facts.appendonly == "yes":
        if facts.appendfsync == "always":
            found.append(Finding(Level.OK, "appendfsync", "always"))
        elif facts.appendfsync == "everysec":
            found.append(Finding(Level.WARN, "appendfsync", "everysec: a crash of Redis itself can "
                                 "lose up to a second of acknowledged transitions"))
        else:
            found.append(Finding(Level.FAIL, "appendfsync", f"{facts.appendfsync}: the kernel decides "
                                 "when transitions reach the disk; set `appendfsync always`"))
    if facts.maxmemory_policy is not None:
        if facts.maxmemory_policy == "noeviction":
            found.append(Finding(Level.OK, "maxmemory-policy", "noeviction"))
        else:
            found.append(Finding(Level.FAIL, "maxmemory-policy", f"{facts.maxmemory_policy}: a full "
                                 "Redis may evict session state; set `maxmemory-policy noeviction`"))
    return found


def cluster_finding(facts: ServerFacts) -> Finding | None:
    if facts.cluster_enabled:
        return Finding(Level.FAIL, "cluster", "a Redis Cluster node: Parley does not support Redis "
                       "Cluster; use shards of plain or Sentinel-managed primaries")
    return None


def examine(facts: ServerFacts) -> list[Finding]:
    """Every finding about one server, in the order the report prints them."""
    cluster = cluster_finding(facts)
    return [*([cluster] if cluster else []), default_user_finding(facts.default_user),
            *persistence_findings(facts)]


def failed(findings: list[Finding]) -> bool:
    return any(f.level is Level.FAIL for f in findings)
