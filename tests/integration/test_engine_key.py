"""The engine's key (dispatcher/engine_key.py): made once and shared through Redis, made again
when Redis has lost it, and followed by signers and verifiers that read it before that."""

import orjson
import pytest
import redis

from parley.dispatcher.core import AppInfo
from parley.dispatcher.engine_key import EngineKey
from parley.dispatcher.enqueue import Outbox
from parley.dispatcher.entries import EntryDecoder, Prepared, Refused
from parley.schemas.codes import RefusalCode
from parley.schemas.keys import Keys
from parley.schemas.results import WorkOutcome
from parley.schemas.signing import ENGINE_PRINCIPAL, Keyring, engine_input_id, signed_fields

KEYS = Keys()
CHILD = "p:sub-1"


def engine_entry(secret: str) -> dict[bytes, bytes]:
    raw = orjson.dumps({"type": "session.close", "reason": "timeout",
                        "parent": {"session": "p", "call_id": "call-1", "attempt": 1}})
    key = engine_input_id(secret, CHILD, "close")
    signed = signed_fields(secret, ENGINE_PRINCIPAL, CHILD, key, raw)
    return {b"session": CHILD.encode(), b"id": key.encode(), b"input": raw,
            **{k.encode(): v.encode() for k, v in signed.items()}}


def decoder_with(engine_key: EngineKey) -> EntryDecoder:
    ring = Keyring({}, required=True).with_engine_key(engine_key.current())
    return EntryDecoder(AppInfo(), keyring=ring, reload_engine_key=engine_key.fresher)


def lose_and_remake(r: redis.Redis) -> str:
    """Redis loses the key; the next dispatcher to start makes a new one."""
    r.delete(KEYS.engine_key)
    return EngineKey(r, KEYS).load()


def test_a_verifier_follows_a_key_made_again_after_redis_lost_it(r: redis.Redis,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EngineKey, "RELOAD_EVERY_S", 0.0)
    running = EngineKey(r, KEYS)
    decoder = decoder_with(running)
    before = decoder.keyring.engine_key
    fresh = lose_and_remake(r)
    assert fresh != before
    assert isinstance(decoder.prepare("parley:inputs", True, "1-1", engine_entry(fresh)), Prepared)
    assert decoder.keyring.engine_key == fresh
    # the key it held before is no longer the engine's: an entry signed with it is refused
    refused = decoder.prepare("parley:inputs", True, "1-2", engine_entry(before or ""))
    assert isinstance(refused, Refused) and refused.code == RefusalCode.UNAUTHORIZED


def test_bad_engine_signatures_read_the_key_again_at_most_once_a_period(r: redis.Redis) -> None:
    running = EngineKey(r, KEYS)
    decoder = decoder_with(running)
    reads: list[str | None] = []
    decoder.reload_engine_key = lambda: reads.append(running.reload_if_due()) or reads[-1]
    for n in range(5):
        out = decoder.prepare("parley:inputs", True, f"1-{n}", engine_entry("a guess"))
        assert isinstance(out, Refused) and out.code == RefusalCode.UNAUTHORIZED
    # read at start, so none of the five was due: an attacker's entries cost no Redis reads
    assert reads == [None] * 5


def test_a_signer_signs_with_the_key_redis_holds_now(r: redis.Redis) -> None:
    outbox = Outbox(r, KEYS)
    old = outbox.engine_key.current()
    fresh = lose_and_remake(r)
    pipe = r.pipeline()
    parent = {"session": "p", "call_id": "call-1", "attempt": 1}
    close = {"type": "session.close", "reason": "timeout", "parent": parent}
    outbox._engine_input(pipe, CHILD, "close", close)
    pipe.execute()
    [(_entry_id, fields)] = r.xrange(outbox.input_stream(CHILD))
    verified = Keyring({}, required=True).with_engine_key(fresh)
    assert verified.verify(fields, int(fields[b"ts"])) == ENGINE_PRINCIPAL
    assert fields[b"id"].decode() == engine_input_id(fresh, CHILD, "close")
    assert engine_input_id(fresh, CHILD, "close") != engine_input_id(old, CHILD, "close")


def test_the_engines_input_ids_are_its_own_and_the_same_on_every_flush() -> None:
    assert engine_input_id("k", CHILD, "spawn") == engine_input_id("k", CHILD, "spawn")
    assert len({engine_input_id("k", CHILD, "spawn"), engine_input_id("k", CHILD, "close"),
                engine_input_id("k", "p:sub-2", "spawn"), engine_input_id("other", CHILD, "spawn")}) == 4


def test_a_verifier_takes_the_key_its_own_signer_has_just_read(r: redis.Redis) -> None:
    """Signer and verifier of one dispatcher share one EngineKey: when the signer has read a
    key made again (Redis lost it), what it signs next verifies at once, though the signer's
    read has just reset the verifier's once-a-period reload (issue 31's review: a deadline
    signed so was refused for as long as deadlines kept firing)."""
    outbox = Outbox(r, KEYS)
    decoder = decoder_with(outbox.engine_key)
    lose_and_remake(r)
    deadline = WorkOutcome(session="p", work="int-1", attempt=0, kind="deadline", ok=True)
    fields = outbox.engine_outcome_fields(deadline)  # reads the key Redis holds now
    prepared = decoder.prepare("parley:results", False, "1-1", {k.encode(): v for k, v in fields.items()})
    assert isinstance(prepared, Prepared), prepared
    # and an engine input signed with it too, without another read
    signed = engine_entry(outbox.engine_key.current())
    assert isinstance(decoder.prepare("parley:inputs", True, "1-2", signed), Prepared)
