"""The submit function `parley_submit` (dispatcher/lua/functions.lua) on a real redis-server:
what it admits and how (docs/protocol.md, "Writing inputs"), each refusal writing nothing, the
library's version check and reload (dispatcher/functions.py), and the clients and the CLI
submitting through it when they name their producer."""

import asyncio
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio

from parley.aclient import AsyncClient
from parley.client import Client
from parley.client.producer import SubmitRefused, SubmitUnavailable
from parley.dispatcher.functions import LIBRARY, Functions, library_code
from parley.runtime.procs import RedisServer
from parley.schemas.codec import InputError
from parley.schemas.keys import Keys, partition_of
from tests.forkserver import run_parley
from tests.integration.conftest import MakeDispatcher, tick

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()
STREAM, PENDING = KEYS.producer_inputs("app"), KEYS.pending("app")
MESSAGE = {"type": "message.create", "content": "hi"}
#: what an entry may be over the input limit (schemas/codec.py ENVELOPE_BYTES)
ENVELOPE_BYTES = 4096


@pytest.fixture
def loaded(r: redis.Redis) -> Functions:
    functions = Functions(r)
    functions.ensure()
    return functions


@pytest.fixture
def app(r: redis.Redis, loaded: Functions) -> Client:
    return Client(r, producer="app")


def submit(r: redis.Redis, *fields: Any, keys: tuple[str, str] = (STREAM, PENDING),
           producer: str = "app") -> str:
    """FCALL as any producer may call it, without the client's own checks."""
    reply: Any = r.fcall("parley_submit", 2, *keys, "parley", producer, *fields)
    return str(reply.decode())


def entry(session: str, value: Any, **extra: Any) -> list[Any]:
    fields = {"session": session, "input": orjson.dumps(value), **extra}
    return [item for pair in fields.items() for item in pair]


def refused(r: redis.Redis, code: str, *fields: Any, **kwargs: Any) -> str:
    """Submit, expecting refusal `code`; checks nothing was written. Returns the message."""
    before = (r.xlen(STREAM), r.hgetall(PENDING))
    with pytest.raises(redis.ResponseError) as err:
        submit(r, *fields, **kwargs)
    assert str(err.value).startswith(f"PARLEY {code} "), err.value
    assert (r.xlen(STREAM), r.hgetall(PENDING)) == before
    return str(err.value)


def test_an_admitted_input_is_appended_marked_and_counted_pending(r: redis.Redis, app: Client) -> None:
    entry_id = app.send("s-1", MESSAGE, "k-1")
    [(got_id, fields)] = r.xrange(STREAM)
    assert got_id.decode() == entry_id
    assert fields == {b"session": b"s-1", b"input": orjson.dumps(MESSAGE), b"id": b"k-1", b"admitted": b"1"}
    assert r.hgetall(PENDING) == {b"s-1": b"1"}
    app.send("s-1", {"type": "branch.switch", "head": "msg-1"})
    assert r.hgetall(PENDING) == {b"s-1": b"2"}
    assert not r.exists("parley:inputs")  # the shared stream is not this client's


def test_with_partitions_the_producer_writes_its_own_stream_of_the_sessions_partition(
        r: redis.Redis, loaded: Functions) -> None:
    r.hset(KEYS.config, "partitions", 4)
    app = Client(r, producer="app")
    app.send("s-7", MESSAGE)
    stream = KEYS.producer_inputs("app", partition_of("s-7", 4), 4)
    assert app.stream_for("s-7") == stream and r.xlen(stream) == 1


def test_signed_inputs_keep_their_signature_fields(r: redis.Redis, app: Client) -> None:
    app.send("s-1", MESSAGE, principal="ada", key="secret")
    [(_id, fields)] = r.xrange(STREAM)
    assert {b"principal", b"ts", b"sig", b"id", b"admitted"} <= set(fields)


def test_the_101st_pending_input_of_a_session_is_rate_limited_and_others_go_on(
        r: redis.Redis, app: Client) -> None:
    for i in range(100):
        app.send("s-1", {"type": "message.create", "content": f"m{i}"})
    with pytest.raises(SubmitRefused) as err:
        app.send("s-1", MESSAGE)
    assert err.value.code == "rate_limited"
    assert err.value.message == "100 inputs of session s-1 are pending"
    assert r.xlen(STREAM) == 100 and r.hget(PENDING, "s-1") == b"100"
    app.send("s-2", MESSAGE)  # another session of the same producer is not held back
    r.hincrby(PENDING, "s-1", -1)  # a dispatcher acknowledged one: room for one more
    app.send("s-1", MESSAGE)
    refused(r, "rate_limited", *entry("s-1", MESSAGE))


def test_the_limits_come_from_the_config_hash(r: redis.Redis, app: Client) -> None:
    r.hset(KEYS.config, mapping={"limit_pending": 2, "limit_input_bytes": 200})
    app.send("s-1", MESSAGE)
    app.send("s-1", MESSAGE)
    assert "2 inputs of session s-1 are pending" in refused(r, "rate_limited", *entry("s-1", MESSAGE))
    message = refused(r, "too_large", *entry("s-2", {"type": "message.create", "content": "x" * 200}))
    assert "over the limit of 200" in message


def test_an_entry_over_one_mib_is_too_large_by_default(r: redis.Redis, loaded: Functions) -> None:
    big = {"type": "message.create", "content": "x" * (5 * 1024 * 1024)}
    assert "over the limit of 1048576" in refused(r, "too_large", *entry("s-1", big))
    submit(r, *entry("s-1", {"type": "message.create", "content": "x" * (1024 * 1024 - 100)}))


def test_the_whole_entry_counts_as_the_dispatcher_counts_it(r: redis.Redis, loaded: Functions) -> None:
    """Every field but `admitted`, names and values: at most the input limit and 4,096 bytes
    (schemas/codec.py entry_bytes, ENVELOPE_BYTES); the dispatcher refuses the same entries."""
    from parley.schemas.codec import decode_input_entry

    def entry_bytes(fields: dict[Any, Any]) -> int:
        def size(x: Any) -> int:
            return len(x if isinstance(x, bytes) else x.encode())
        return sum(size(k) + size(v) for k, v in fields.items() if k not in ("admitted", b"admitted"))

    r.hset(KEYS.config, "limit_input_bytes", 1000)
    base = {"session": "s-1", "input": orjson.dumps({"type": "message.create", "content": "x" * 900})}
    pad = "p" * (1000 + ENVELOPE_BYTES - entry_bytes(base) - len("pad"))
    fits = [item for pair in {**base, "pad": pad}.items() for item in pair]
    written = submit(r, *fits)
    [(_id, stored)] = r.xrange(STREAM, written, written)
    assert entry_bytes(stored) == 1000 + ENVELOPE_BYTES
    decode_input_entry(stored, 1000)  # the dispatcher: within the limit too
    over = [*fits[:-1], fits[-1] + "p"]
    message = refused(r, "too_large", *over)
    assert f"the entry has {1001 + ENVELOPE_BYTES} bytes, over the limit of {1000 + ENVELOPE_BYTES}" \
        in message
    with pytest.raises(InputError, match=f"the entry has {1001 + ENVELOPE_BYTES} bytes") as err:
        decode_input_entry({**stored, b"pad": stored[b"pad"] + b"p"}, 1000)
    assert err.value.code == "too_large"


def test_a_full_session_refuses_messages_but_not_other_inputs(r: redis.Redis, app: Client) -> None:
    r.hset(KEYS.meta("s-1"), mapping={"n_msgs": 10_000, "n_branches": 3})
    with pytest.raises(SubmitRefused) as err:
        app.send("s-1", MESSAGE)
    assert (err.value.code, err.value.message) == ("session_full",
                                                   "session s-1 has 10000 messages, the limit")
    app.send("s-1", {"type": "interrupt.resume", "interrupt_id": "int-1"})  # its pending work goes on
    app.send("s-1", {"type": "session.close"})
    r.hset(KEYS.config, "limit_messages", 20_000)
    app.send("s-1", MESSAGE)


def test_at_the_branch_limit_a_message_naming_its_parent_is_refused(r: redis.Redis, app: Client) -> None:
    r.hset(KEYS.config, "limit_branches", 3)
    r.hset(KEYS.meta("s-1"), mapping={"n_msgs": 10, "n_branches": 3})
    for parent in ("msg-2", None):
        with pytest.raises(SubmitRefused, match="session_full: session s-1 has 3 branches, the limit"):
            app.send("s-1", {**MESSAGE, "parent_id": parent})
    app.send("s-1", MESSAGE)  # following the active head: the dispatcher decides exactly
    r.hset(KEYS.meta("s-1"), "n_branches", 2)
    app.send("s-1", {**MESSAGE, "parent_id": "msg-2"})


@pytest.mark.parametrize(("fields", "says"), [
    (entry("bad id!", MESSAGE), "`session` must be"),
    (entry("x" * 129, MESSAGE), "`session` must be"),
    (entry("Bad Tenant!/s-1", MESSAGE), "`session` must be"),
    (entry("s-1", MESSAGE, admitted="0"), "`admitted` is set by the submit function"),
    (["session", "s-1", "id", "k"], "needs the fields `session` and `input`"),
    (["session", "s-1", "input"], "call it as FCALL parley_submit"),
])
def test_a_malformed_entry_is_refused_invalid_input(r: redis.Redis, loaded: Functions,
                                                    fields: list[Any], says: str) -> None:
    assert says in refused(r, "invalid_input", *fields)


def test_an_engine_child_id_up_to_256_characters_is_admitted(r: redis.Redis, app: Client) -> None:
    child = "p" * 240 + ":sub-1"
    app.send(child, {"type": "interrupt.resume", "interrupt_id": "int-1"})
    assert r.xlen(STREAM) == 1


@pytest.mark.parametrize(("keys", "producer"), [
    (("parley:inputs", PENDING), "app"),            # the shared stream
    ((KEYS.producer_inputs("b"), PENDING), "app"),  # another producer's stream
    ((STREAM, KEYS.pending("b")), "app"),            # another producer's pending hash
    ((KEYS.producer_inputs("app") + ":x", PENDING), "app"),
    ((STREAM, PENDING), "Bad:name"),
])
def test_keys_other_than_the_producers_own_are_refused(r: redis.Redis, loaded: Functions,
                                                       keys: tuple[str, str], producer: str) -> None:
    refused(r, "invalid_input", *entry("s-1", MESSAGE), keys=keys, producer=producer)
    assert not r.exists("parley:inputs", KEYS.producer_inputs("b"), KEYS.pending("b"))


def test_a_bad_input_json_is_left_to_the_dispatcher(r: redis.Redis, loaded: Functions) -> None:
    """The function reads the input's type only to count messages; an input that does not parse
    is admitted and refused exactly by the dispatcher (docs/protocol.md, "Rejected entries")."""
    submit(r, "session", "s-1", "input", "{not json")
    assert r.xlen(STREAM) == 1


# ---- the library's version and reload -------------------------------------------------------------

def at_version(code: str, version: int) -> str:
    """The library's code declaring another version."""
    return re.sub(r"^local VERSION = \d+$", f"local VERSION = {version}", code, count=1, flags=re.MULTILINE)


def test_the_library_is_loaded_when_missing_or_older_and_left_when_newer(r: redis.Redis) -> None:
    functions = Functions(r)
    assert functions.loaded_version() is None
    assert functions.ensure() is True and functions.loaded_version() == functions.version
    assert functions.ensure() is False  # the same version: not loaded again
    assert r.fcall("parley_version", 0) == functions.version
    r.execute_command("FUNCTION", "LOAD", "REPLACE", at_version(library_code(), 0))
    assert functions.loaded_version() == 0
    assert functions.ensure() is True and functions.loaded_version() == functions.version
    newer = functions.version + 1
    r.execute_command("FUNCTION", "LOAD", "REPLACE", at_version(library_code(), newer))
    assert functions.ensure() is False and functions.loaded_version() == newer  # never downgraded


def test_a_dispatcher_loads_the_library_at_start_and_again_after_it_is_lost(
        r: redis.Redis, make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    app = Client(r, producer="app")
    app.send("s-1", MESSAGE)
    r.function_flush()  # as a Redis started empty would hold
    with pytest.raises(SubmitUnavailable, match="start a dispatcher, or retry within seconds"):
        app.send("s-1", MESSAGE)
    assert r.xlen(STREAM) == 1
    d.functions.recheck()  # a lapse of CHECK_S, or the end of an outage the loop noticed
    tick(d, 1)
    assert r.function_list(library=LIBRARY)
    app.send("s-1", MESSAGE)
    assert r.xlen(STREAM) == 2


def test_a_dispatcher_checks_the_library_every_check_s(r: redis.Redis,
                                                       make_dispatcher: MakeDispatcher) -> None:
    d = make_dispatcher()
    r.function_flush()
    tick(d, 1)
    assert not r.function_list(library=LIBRARY)  # checked at start, not due yet
    d.functions.check_s = 0
    tick(d, 1)
    assert r.function_list(library=LIBRARY)


# ---- the async client and the CLI -----------------------------------------------------------------

def test_the_async_client_submits_and_raises_refusals(r: redis.Redis, redis_server: RedisServer,
                                                     loaded: Functions) -> None:
    async def main() -> tuple[str, SubmitRefused]:
        conn = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            app = AsyncClient(conn, producer="app")
            entry_id = await app.send("s-1", MESSAGE)
            await conn.hset(KEYS.config, "limit_pending", 1)
            try:
                await app.send("s-1", MESSAGE)
            except SubmitRefused as err:
                return entry_id, err
            raise AssertionError("not refused")
        finally:
            await conn.aclose()

    entry_id, err = asyncio.run(main())
    assert r.xrange(STREAM)[0][0].decode() == entry_id and err.code == "rate_limited"


def parley(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    environ |= {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return run_parley(["--redis-url", url, *args],
                          text=True, env=environ | (env or {}), timeout=60, check=False)


def test_the_cli_submits_as_its_producer_and_exits_7_on_a_refusal(
        r: redis.Redis, redis_server: RedisServer, loaded: Functions) -> None:
    url = redis_server.url
    sent = parley(url, "--producer", "app", "send", "s-1", "hello")
    assert sent.returncode == 0, sent.stderr
    assert r.xrange(STREAM)[0][0].decode() == sent.stdout.strip()
    by_env = parley(url, "input", "s-1", '{"type": "session.create"}', env={"PARLEY_PRODUCER": "app"})
    assert by_env.returncode == 0 and r.xlen(STREAM) == 2
    r.hset(KEYS.config, "limit_pending", 2)
    for args in (["send", "s-1", "again"], ["resume", "s-1", "int-1"], ["close", "s-1"],
                 ["switch", "s-1", "msg-1"]):
        out = parley(url, "--producer", "app", *args)
        assert out.returncode == 7, out.stderr
        assert out.stderr.strip() == "parley: refused rate_limited: 2 inputs of session s-1 are pending"
    assert r.xlen(STREAM) == 2


def test_the_cli_says_when_the_function_is_missing_and_refuses_a_bad_producer_name(
        r: redis.Redis, redis_server: RedisServer) -> None:
    out = parley(redis_server.url, "--producer", "app", "send", "s-1", "hello")
    assert out.returncode == 75, out.stderr
    assert out.stderr.strip().startswith("parley: the submit function is not loaded in Redis")
    bad = parley(redis_server.url, "--producer", "App:x", "send", "s-1", "hello")
    assert bad.returncode == 2 and "invalid producer name 'App:x'" in bad.stderr
    assert not r.keys("parley:*")


def test_the_library_survives_a_redis_restart_from_its_aof(redis_server: RedisServer) -> None:
    conn = redis.Redis.from_url(redis_server.url)
    Functions(conn).ensure()
    conn.close()
    redis_server.stop(kill=True)  # appendfsync always: FUNCTION LOAD is in the AOF
    redis_server.start()
    conn = redis.Redis.from_url(redis_server.url)
    assert Functions(conn).loaded_version() == Functions(conn).version
    conn.close()


# ---- the session's partition under the count published now (issue 35: `partitions resize`) ----


def test_an_input_is_taken_only_on_its_sessions_partition_stream(r: redis.Redis, loaded: Functions) -> None:
    """The function computes crc32(root id) mod N as Python's zlib does: over 300 ids (sub-agents
    among them), the stream of the partition Python names is taken and every other refused
    `moved`, so a producer with an old count reads it again instead of writing astray."""
    n = 7
    r.hset(KEYS.config, "partitions", n)
    ids = [f"s-{i}" for i in range(150)] + [f"team/a.b_{i}:sub-{i % 3}:sub-2" for i in range(150)]
    for session in ids:
        right = partition_of(session, n)
        submit(r, *entry(session, MESSAGE), keys=(KEYS.producer_inputs("app", right, n), PENDING))
        wrong = (right + 1 + (len(session) % (n - 1))) % n
        says = rf"PARLEY moved session \S+ is in partition {right} of 7"
        with pytest.raises(redis.ResponseError, match=says):
            submit(r, *entry(session, MESSAGE), keys=(KEYS.producer_inputs("app", wrong, n), PENDING))
    assert sum(r.xlen(KEYS.producer_inputs("app", p, n)) for p in range(n)) == len(ids)
    # with one partition, the unsuffixed stream only; a suffixed one is refused
    r.hset(KEYS.config, "partitions", 1)
    submit(r, *entry("s-1", MESSAGE))
    with pytest.raises(redis.ResponseError, match="PARLEY moved"):
        submit(r, *entry("s-1", MESSAGE), keys=(KEYS.producer_inputs("app", 0, 4), PENDING))


def test_a_client_with_an_old_partition_count_reads_it_again_when_refused(r: redis.Redis,
                                                                         app: Client) -> None:
    r.hset(KEYS.config, "partitions", 4)
    session = next(f"c-{i}" for i in range(100) if partition_of(f"c-{i}", 8) != partition_of(f"c-{i}", 4))
    app.send("warm", MESSAGE, "warm")  # the client has read the count 4
    r.hset(KEYS.config, "partitions", 8)  # resized meanwhile
    app.send(session, MESSAGE, f"{session}-1")
    assert r.xlen(KEYS.producer_inputs("app", partition_of(session, 8), 8)) == 1
    assert [f[b"session"] for _i, f in r.xrange(KEYS.producer_inputs("app", partition_of(session, 4), 4))] \
        in ([], [b"warm"])


def test_a_producer_named_by_digits_is_not_read_as_a_partition(r: redis.Redis, loaded: Functions) -> None:
    """`parley:in:42` is producer 42's unpartitioned stream, not partition 42 of `parley:in`;
    and `...:03` is no partition's name (the dispatchers read `...:3`)."""
    submit(r, *entry("s-1", MESSAGE), keys=(KEYS.producer_inputs("42"), KEYS.pending("42")), producer="42")
    r.hset(KEYS.config, "partitions", 4)
    p = partition_of("s-1", 4)
    submit(r, *entry("s-1", MESSAGE), keys=(KEYS.producer_inputs("42", p, 4), KEYS.pending("42")),
           producer="42")
    with pytest.raises(redis.ResponseError, match="PARLEY moved"):
        submit(r, *entry("s-1", MESSAGE), keys=(f"{KEYS.producer_inputs('app')}:0{p}", PENDING))
