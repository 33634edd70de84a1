"""Redis shell around the machine: load a session's state, commit a transition atomically."""

from importlib.resources import files
from typing import Any

import orjson
from redis import Redis
from redis.commands.core import Script

from dispatcher.machine import Transition
from dispatcher.state import Core, SessionState
from schemas.keys import Keys

IDEMPOTENCY_TTL_S = 24 * 3600
DEFAULT_EVENTS_MAXLEN = 10_000

COMMITTED, CONFLICT, LEASE_LOST = 1, 0, -1


def load_script(redis: Redis, name: str) -> Script:
    """A Lua script of dispatcher/lua/, registered once (EVALSHA, loaded again if flushed)."""
    return redis.register_script(files("dispatcher").joinpath(f"lua/{name}.lua").read_text())


class Store:
    def __init__(self, redis: Redis, keys: Keys, events_maxlen: int = DEFAULT_EVENTS_MAXLEN):
        self.redis = redis
        self.keys = keys
        self.events_maxlen = events_maxlen
        self._commit = load_script(redis, "commit")

    def load(self, session: str, idempotency_key: str | None = None) -> tuple[SessionState, str]:
        """One round trip: version, core, markers, messages, and whether the key was used."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.meta(session), "ver", "core", "applied")
        pipe.hgetall(self.keys.messages(session))
        if idempotency_key is not None:
            pipe.exists(self.keys.idempotency(session, idempotency_key))
        replies = pipe.execute()
        ver, core, applied = replies[0]
        state = SessionState(
            core=Core.model_validate_json(core) if core else None,
            messages={k.decode(): orjson.loads(v) for k, v in replies[1].items()},
            applied=orjson.loads(applied) if applied else {},
            duplicate=bool(replies[2]) if idempotency_key is not None else False,
        )
        return state, ver.decode() if ver else "0"

    def commit(self, session: str, version: str, tr: Transition, lease_key: str,
               lease_token: str) -> int:
        k = self.keys
        core = tr.state.core
        argv: list[Any] = [
            version, lease_token, core.to_json() if core is not None else "",
            orjson.dumps(tr.state.applied), self.events_maxlen,
            IDEMPOTENCY_TTL_S if tr.idempotency_key else 0,
            len(tr.new_messages)]
        for m in tr.new_messages:
            argv += [m["id"], orjson.dumps(m)]
        argv.append(len(tr.events))
        argv += [orjson.dumps(e) for e in tr.events]
        argv.append(len(tr.effects))
        for fx in tr.effects:
            argv += [fx["seq"], orjson.dumps(fx)]
        idem = k.idempotency(session, tr.idempotency_key) if tr.idempotency_key else k.meta(session)
        keys = [k.meta(session), k.messages(session), k.events(session), k.outbox(session), idem,
                lease_key]
        return int(self._commit(keys=keys, args=argv))

    def pending_effects(self, session: str) -> list[dict[str, Any]]:
        raw = self.redis.hgetall(self.keys.outbox(session))
        return sorted((orjson.loads(v) for v in raw.values()), key=lambda fx: fx["seq"])
