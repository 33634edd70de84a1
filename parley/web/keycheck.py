"""The inbox's check at start: do the dispatchers have its keys? (docs/inbox.md, "The keys
file"). The comparison is schemas/keyprints.py's; this reads each shard's `parley:keyprints`
and logs one WARNING line per problem, or one INFO line when there is none.

Each shard's dispatchers publish on their own shard, because an answer is verified by the
dispatchers of its session's shard: a key missing on one shard is a problem there only, and
the line names the shard. A shard where nothing is published yet is looked at again for a
while (`WAIT_S`) before it is reported, in a thread, as the page serves: a deployment starts
the inbox alongside its dispatchers (compose does), and they publish only once up. The check
never stops the page from starting.
"""

import logging
import threading
import time
from collections.abc import Mapping, Sequence

import redis
from redis.exceptions import NoPermissionError, RedisError

from parley.runtime.logs import kv
from parley.schemas.keyprints import (
    INBOX,
    KeyProblem,
    KeyTrouble,
    PublishedKeys,
    Signer,
    compare_keys,
    describe,
    read_published,
    summary,
)
from parley.schemas.keys import Keys

log = logging.getLogger("parley.inbox")

#: how long a shard where no dispatcher has published yet is looked at again before it is said
WAIT_S = 30.0
#: how often it is looked at meanwhile
EVERY_S = 1.0


def read_shard(r: redis.Redis, keys: Keys, shard: int | None) -> PublishedKeys | KeyProblem:
    """One shard's published keys, or the problem that kept them from being read."""
    try:
        fields = r.hgetall(keys.keyprints)
    except NoPermissionError as exc:
        return KeyProblem(KeyTrouble.NOT_READ, shard=shard, detail=(
            f"this Redis login may not read {keys.keyprints}: load the new deploy/redis/users.acl; "
            f"{str(exc).splitlines()[0]}"))
    except RedisError as exc:
        return KeyProblem(KeyTrouble.NOT_READ, shard=shard, detail=str(exc) or type(exc).__name__)
    return read_published(fields)


class KeyCheck:
    """The check of one signer's keys against every shard's dispatchers: `look` once at start,
    then `wait` for the shards where nothing was published yet."""

    def __init__(self, shards: Sequence[redis.Redis], keys: Keys, signer_keys: Mapping[str, Sequence[str]],
                 signer: Signer = INBOX):
        self.keys, self.signer_keys, self.signer = keys, signer_keys, signer
        self.several = len(shards) > 1
        #: the shards not settled yet, by index
        self.pending: dict[int, redis.Redis] = dict(enumerate(shards))
        #: every problem's line, as logged
        self.lines: list[str] = []
        self.found: list[PublishedKeys] = []
        if not any(signer_keys.values()):
            self.pending.clear()  # it signs nothing: nothing the dispatchers could refuse

    def look(self, final: bool = False) -> bool:
        """Read every pending shard once and report what is settled; a shard with nothing
        published stays pending (unless `final`). True while some shard is pending."""
        for i, r in list(self.pending.items()):
            shard = i if self.several else None
            read = read_shard(r, self.keys, shard)
            if isinstance(read, PublishedKeys):
                if not read.records and not read.unreadable and not final:
                    continue  # its dispatchers may be starting: looked at again
                self.found.append(read)
                self._report(compare_keys(self.signer_keys, read, shard))
            else:
                self._report([read])
            del self.pending[i]
        return bool(self.pending)

    def wait(self, wait_s: float = WAIT_S, every_s: float = EVERY_S) -> list[str]:
        """Look again until nothing is pending or `wait_s` has passed (then a shard still without
        a record is reported); then, when no problem was found, the summary at INFO."""
        deadline = time.monotonic() + wait_s
        if self.pending:
            where = "" if not self.several else f" on shard {', '.join(map(str, sorted(self.pending)))}"
            log.info(f"no dispatcher has published its keys yet{where}: looking again for {wait_s:g} s",
                     extra=kv(check="keys"))
        while self.look(final=time.monotonic() >= deadline):
            time.sleep(max(0.0, min(every_s, deadline - time.monotonic())))
        if not self.lines and self.found:
            log.info(summary(self.signer_keys, self.found, self.signer), extra=kv(check="keys"))
        return self.lines

    def _report(self, problems: list[KeyProblem]) -> None:
        for problem in problems:
            line = describe(problem, self.signer)
            self.lines.append(line)
            fields = {"check": "keys", "trouble": problem.trouble.value}
            if problem.principal is not None:
                fields["principal"] = problem.principal
            if problem.shard is not None:
                fields["shard"] = str(problem.shard)
            log.warning(line, extra=kv(**fields))


def check_keys(shards: Sequence[redis.Redis], keys: Keys, signer_keys: Mapping[str, Sequence[str]],
               signer: Signer = INBOX, wait_s: float = WAIT_S) -> KeyCheck:
    """What `parley inbox` runs before it serves: every shard looked at now, and what is
    settled logged at once; the shards where nothing is published yet are looked at again in a
    thread for `wait_s` (`KeyCheck.wait`). Closes `shards` once done with them."""
    check = KeyCheck(shards, keys, signer_keys, signer)

    def finish() -> None:
        try:
            check.wait(wait_s)
        except Exception:  # a bug here must not go unseen, nor take the page down
            log.exception("the keys check failed", extra=kv(check="keys"))
        finally:
            for r in shards:
                r.close()

    if check.look():
        threading.Thread(target=finish, name="parley-keycheck", daemon=True).start()
    else:
        finish()
    return check
