"""Fuzzing the input path (docs/protocol.md, Writing inputs, Order of checks, Rejected entries):
the decoder directly, then a live `parley dispatcher`.

The decoder must answer every entry with an `InputEntry` or an `InputError`, never anything
else, and decode every valid entry to exactly the input that was sent. The live dispatcher,
fed a seeded mix of ~2,000 random, mutated and valid entries, must stay up, reject exactly
the bad ones to `parley:inputs:rejected` (copied, cut to 4 KiB a field, with `error`, `source`,
`entry`) and
apply every valid one. What is bad is never guessed: the decoder itself (then, for an entry
with a `sig`, the signature check) is the oracle, `tests.fuzz_corpus.oracle`. Run with `-s`
to see the counts.
"""

import random
import time
from collections import Counter
from typing import Any

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.client import Client
from parley.dispatcher.entries import entry_key
from parley.dispatcher.rejected import rejected_copy
from parley.dispatcher.store import Store
from parley.schemas.codec import (
    DEFAULT_MAX_INPUT_BYTES,
    MAX_DEPTH,
    InputEntry,
    InputError,
    decode_input_entry,
    session_of,
)
from parley.schemas.ids import is_session_id
from parley.schemas.inputs import INPUT_TYPES
from parley.schemas.keys import Keys
from tests import fuzz_corpus as fz
from tests.conftest import Procs


def fuzz(examples: int) -> settings:
    """No deadline (a 256 KiB entry takes a while), no example database left behind."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- hypothesis strategies ---------------------------------------------------------------------

IDS = st.text(alphabet=fz.ID_ALPHABET, min_size=1, max_size=128)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16)
BUDGET = st.fixed_dictionaries({}, optional={k: st.none() | st.integers(0, 2**63 - 1)
                                             for k in ("llm_calls", "tool_calls", "tokens")})
PARENT = st.fixed_dictionaries({
    "session": st.text(alphabet=fz.ID_ALPHABET, min_size=1, max_size=256), "call_id": IDS,
    "attempt": st.integers(-(2**63), 2**63 - 1), "app": st.text(min_size=1, max_size=256),
    "reply_to": st.from_regex(r"\A[A-Za-z0-9._-]{1,20}:results(:[0-9]{1,3})?\Z")})
VALID_INPUTS = st.one_of(
    st.fixed_dictionaries({"type": st.just("session.create")}, optional={
        "budget": st.none() | BUDGET, "metadata": st.none() | st.dictionaries(st.text(max_size=8), JSON),
        "parent": st.none() | PARENT}),
    st.fixed_dictionaries({"type": st.just("message.create"), "content": st.text(max_size=300)},
                          optional={"parent_id": st.none() | IDS, "message_id": st.none() | IDS}),
    st.fixed_dictionaries({"type": st.just("interrupt.resume"), "interrupt_id": IDS},
                          optional={"payload": JSON}),
    st.fixed_dictionaries({"type": st.just("branch.switch"), "head": IDS}),
    st.fixed_dictionaries({"type": st.just("tool.result"), "call_id": IDS, "result": JSON}),
    st.fixed_dictionaries({"type": st.just("tool.result"), "call_id": IDS, "error": st.text(max_size=100)}),
)
IDEMPOTENCY_KEYS = st.none() | st.text(min_size=1, max_size=256)
# Fields the decoder does not read: kept by the dispatcher, harmless to decoding.
HARMLESS = st.dictionaries(st.sampled_from(["trace", "producer", "x-request-id"]), st.text(max_size=20),
                           max_size=2)
# A small limit exercises the size check cheaply; None is the real 1 MiB default.
LIMITS = st.none() | st.integers(0, 2048)


@st.composite
def valid_entries(draw: st.DrawFn) -> tuple[dict[Any, Any], str, dict[str, Any], str | None]:
    """(fields, session, input, id) of a valid entry, keys and values as bytes or as str."""
    session, value, idem = draw(IDS), draw(VALID_INPUTS), draw(IDEMPOTENCY_KEYS)
    fields: dict[str, Any] = {"session": session, "input": orjson.dumps(value).decode(), **draw(HARMLESS)}
    if idem is not None:
        fields["id"] = idem
    if draw(st.booleans()):  # as redis-py returns them
        return {k.encode(): v.encode() for k, v in fields.items()}, session, value, idem
    return fields, session, value, idem


def as_bytes(fields: dict[Any, Any]) -> fz.Fields:
    return {(k if isinstance(k, bytes) else k.encode()): (v if isinstance(v, bytes) else v.encode())
            for k, v in fields.items()}


def as_text(fields: fz.Fields) -> dict[str, str] | None:
    """The same entry with str keys and values, when every one of them is valid UTF-8."""
    try:
        return {k.decode(): v.decode() for k, v in fields.items()}
    except UnicodeDecodeError:
        return None


def decode(fields: dict[Any, Any], limit: int | None, counts: Counter[str]) -> InputEntry | InputError:
    """decode_input_entry, with what must hold of its answer; any other exception is a crash."""
    counts["tried"] += 1
    try:
        result = decode_input_entry(fields, limit)
    except InputError as exc:
        counts["rejected"] += 1
        assert str(exc)
        assert exc.input_type is None or isinstance(exc.input_type, str)
        assert all(isinstance(v, str) for v in exc.ids.values())
        return exc
    except Exception:
        counts["crashes"] += 1
        raise
    counts["decoded"] += 1
    assert isinstance(result, InputEntry)
    assert result.input.type in INPUT_TYPES
    assert is_session_id(result.session)
    assert result.principal is None  # only the dispatcher sets it, after verifying a signature
    assert result.idempotency_key is None or 0 < len(result.idempotency_key) <= 256
    raw = fields.get(b"input", fields.get("input"))
    raw = raw if isinstance(raw, bytes) else str(raw).encode()
    assert len(raw) <= (DEFAULT_MAX_INPUT_BYTES if limit is None else limit)
    value = orjson.loads(raw)
    assert depth_of(value) <= MAX_DEPTH
    return result


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 1


def report(name: str, counts: Counter[str]) -> None:
    print(f"\n[fuzz] {name}: tried={counts['tried']} decoded={counts['decoded']} "
          f"rejected={counts['rejected']} crashes={counts['crashes']}")


# ---- 1. the decoder, directly ------------------------------------------------------------------


def test_decoder_decodes_every_valid_entry_to_the_input_sent() -> None:
    counts: Counter[str] = Counter()

    @fuzz(1500)
    @given(valid_entries())
    def run(case: tuple[dict[Any, Any], str, dict[str, Any], str | None]) -> None:
        fields, session, value, idem = case
        result = decode(fields, None, counts)
        assert isinstance(result, InputEntry), f"a valid entry was refused: {result}"
        assert result.session == session
        assert result.idempotency_key == idem
        assert result.input.model_dump(mode="json", exclude_unset=True) == value

    run()
    report("valid entries", counts)
    assert counts["decoded"] == counts["tried"] and counts["crashes"] == 0


def test_decoder_survives_random_field_maps() -> None:
    """Missing, extra and random keys (bytes or str), random bytes and text as values."""
    counts: Counter[str] = Counter()
    keys = (st.sampled_from([b"session", "session", b"input", "input", b"id", "id", b"sig", "ts"])
            | st.binary(max_size=10) | st.text(max_size=10))
    values = (st.binary(max_size=100) | st.text(max_size=100) | IDS | JSON.map(orjson.dumps)
              | VALID_INPUTS.map(orjson.dumps))

    @fuzz(1500)
    @given(st.dictionaries(keys, values, max_size=6) | st.randoms(use_true_random=False).map(
        lambda rng: fz.random_fields(rng, utf8_keys=False)), LIMITS)
    def run(fields: dict[Any, Any], limit: int | None) -> None:
        decode(fields, limit, counts)

    run()
    report("random field maps", counts)
    assert counts["crashes"] == 0


def test_decoder_survives_random_json_inputs() -> None:
    """Any JSON as `input`: wrong types for every field of every type, deep nesting, huge strings."""
    counts: Counter[str] = Counter()
    wrong_types = st.sampled_from(fz.TYPES).flatmap(lambda t: st.fixed_dictionaries(
        {"type": st.just(t)}, optional={f: JSON for f in fz.FIELDS_OF[t] if f != "type"}))
    typed_garbage = st.tuples(st.sampled_from([*fz.TYPES, "nope", ""]),
                              st.dictionaries(st.text(max_size=10), JSON, max_size=5))
    raw_inputs = st.one_of(
        JSON.map(orjson.dumps),
        wrong_types.map(orjson.dumps),
        st.builds(lambda v, t: orjson.dumps({**v[1], "type": v[0]} if t else {"type": v[0], **v[1]}),
                  typed_garbage, st.booleans()),
        # nesting around MAX_DEPTH and past orjson's own limit (1024), in a payload
        st.tuples(st.randoms(use_true_random=False), st.integers(1, 1100)).map(
            lambda p: b'{"type":"interrupt.resume","interrupt_id":"i","payload":'
            + fz.nested_bytes(p[0], p[1]) + b"}"),
        # content sizes straddling the real 1 MiB limit
        st.integers(-40, 40).map(lambda d: orjson.dumps(
            {"type": "message.create", "content": "x" * (DEFAULT_MAX_INPUT_BYTES - 40 + d)})),
    )

    @fuzz(1000)
    @given(IDS, raw_inputs, LIMITS, st.booleans())
    def run(session: str, raw: bytes, limit: int | None, text: bool) -> None:
        fields: dict[Any, Any] = {b"session": session.encode(), b"input": raw}
        if text and (as_str := as_text(fields)) is not None:
            fields = as_str
        decode(fields, limit, counts)

    run()
    report("random JSON inputs", counts)
    assert counts["crashes"] == 0


def test_decoder_survives_mutations_of_valid_entries() -> None:
    """Valid entries of the 5 types, mutated 1-3 times; the same entry as str decodes the same."""
    counts: Counter[str] = Counter()
    bases = st.one_of(valid_entries().map(lambda c: as_bytes(c[0])),
                      st.tuples(st.randoms(use_true_random=False), IDS, st.sampled_from(fz.TYPES)).map(
                          lambda p: fz.entry(p[1], fz.valid_input(p[0], p[2]), fz.rand_name(p[0]))))

    @fuzz(1200)
    @given(bases, st.randoms(use_true_random=False), LIMITS)
    def run(base: fz.Fields, rng: random.Random, limit: int | None) -> None:
        fields, _names = fz.mutate(rng, base, DEFAULT_MAX_INPUT_BYTES if limit is None else limit,
                                   utf8_keys=False)
        result = decode(fields, limit, counts)
        text = as_text(fields)
        if text is not None:  # the dispatcher sees bytes, a producer may pass str: same verdict
            again = _verdict(text, limit)
            if isinstance(result, InputError):
                assert isinstance(again, InputError) and str(again) == str(result)
            else:
                assert again == result

    run()
    report("mutated valid entries", counts)
    assert counts["crashes"] == 0


def _verdict(fields: dict[Any, Any], limit: int | None) -> InputEntry | InputError:
    try:
        return decode_input_entry(fields, limit)
    except InputError as exc:
        return exc


# ---- 2. a live dispatcher ----------------------------------------------------------------------

SEED = 20240611
ENTRIES = 2000
INPUTS = "parley:inputs"
REJECTED = "parley:inputs:rejected"
GROUP = Keys.GROUP


def plan_entries(rng: random.Random) -> list[tuple[str, fz.Fields]]:
    """(category, fields) for ENTRIES entries: about half bad, the rest valid of every type.

    Field names stay valid UTF-8 here (the decoder tests use raw bytes names too): a bad entry
    with a non-UTF-8 field name stops the dispatcher in `reject()`, a known bug, left out.

    Each entry names its own session, so what one does cannot change what another should do
    (a rejected entry's `id` counts as used: docs/protocol.md, Writing inputs); `duplicate`
    re-sends an earlier message.create's session and `id` with new content, and must be ignored.
    """
    plan: list[tuple[str, fz.Fields]] = []
    creates: list[fz.Fields] = []
    for i in range(ENTRIES):
        roll = rng.random()
        if roll < 0.42:
            base = fz.entry(f"fz-b{i}", fz.valid_input(rng), f"kb{i}")
            fields, _names = fz.mutate(rng, base)
            plan.append(("mutated", fields))
        elif roll < 0.50:
            plan.append(("random", fz.random_fields(rng)))
        elif roll < 0.72:
            content = f"fuzz-{i}: {fz.rand_text(rng, 60)}"
            value = fz.valid_input(rng, "message.create", content)
            value.pop("message_id", None)
            if rng.random() < 0.5:  # under the (empty) active head, or as a new root
                value.pop("parent_id", None)
            else:
                value["parent_id"] = None
            fields = fz.entry(f"fz-v{i}", value, f"k{i}")
            creates.append(fields)
            plan.append(("message.create", fields))
        elif roll < 0.77:
            value = fz.valid_input(rng, "session.create")
            plan.append(("session.create", fz.entry(f"fz-v{i}", value, f"k{i}")))
        elif roll < 0.82:
            plan.append(("interrupt.resume", fz.entry(f"fz-v{i}", fz.valid_input(rng, "interrupt.resume"))))
        elif roll < 0.87:
            plan.append(("branch.switch", fz.entry(f"fz-v{i}", fz.valid_input(rng, "branch.switch"))))
        elif roll < 0.92:
            plan.append(("tool.result", fz.entry(f"fz-v{i}", fz.valid_input(rng, "tool.result"), f"k{i}")))
        elif roll < 0.96 or not creates:
            value = {"type": "message.create", "content": f"orphan-{i}", "parent_id": fz.rand_name(rng)}
            plan.append(("unknown_parent", fz.entry(f"fz-v{i}", value)))
        else:
            earlier = rng.choice(creates)
            value = {"type": "message.create", "content": f"duplicate-{i}"}
            plan.append(("duplicate", {**earlier, b"input": orjson.dumps(value)}))
    return plan


def wait_drained(r: redis.Redis, procs: list[Any], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert all(p.poll() is None for p in procs), "a parley process died"
        if r.xlen(INPUTS) == 0 and int(r.xpending(INPUTS, GROUP)["pending"]) == 0:
            return
        assert time.monotonic() < deadline, f"inputs not drained: XLEN {r.xlen(INPUTS)}"
        time.sleep(0.1)


def events_of(r: redis.Redis, session: str) -> list[dict[str, Any]]:
    entries: Any = r.xrange(Keys().events(session))
    return [orjson.loads(f[b"event"]) for _id, f in entries]


def answered(events: list[dict[str, Any]], entry_id: str, kind: str, code: str) -> bool:
    return any(e["type"] == kind and e["input"]["entry"] == entry_id and e["code"] == code for e in events)


@pytest.mark.e2e
def test_live_dispatcher_survives_a_fuzzed_input_stream(procs: Procs, r: redis.Redis,
                                                         client: Client) -> None:
    dispatcher = procs.dispatcher()
    worker = procs.worker()
    plan = plan_entries(random.Random(SEED))
    verdicts = [fz.oracle(fields) for _category, fields in plan]
    ids: list[str] = []
    for start in range(0, len(plan), 200):
        pipe = r.pipeline(transaction=False)
        for _category, fields in plan[start:start + 200]:
            pipe.xadd(INPUTS, fields)  # type: ignore[arg-type]
        ids += [raw.decode() for raw in pipe.execute()]
    started = time.monotonic()
    wait_drained(r, [dispatcher, worker])
    drained_s = time.monotonic() - started

    # every bad entry, and only those, copied whole to the rejected stream with its error
    sent = [fields for _category, fields in plan]
    bad = {entry_id: fields for entry_id, fields, verdict in zip(ids, sent, verdicts, strict=True)
           if not isinstance(verdict, InputEntry)}
    copies: Any = r.xrange(REJECTED)
    rejected: dict[str, dict[bytes, bytes]] = {f[b"entry"].decode(): f for _id, f in copies}
    missing, extra = sorted(set(bad) - set(rejected)), sorted(set(rejected) - set(bad))
    assert not missing and not extra, f"rejected {len(rejected)}, bad {len(bad)}: {missing[:5]}, {extra[:5]}"
    for entry_id, copy in rejected.items():
        assert copy[b"error"] and copy[b"source"] == INPUTS.encode()
        # the entry sent, cut as docs/protocol.md "Rejected entries" says (each value to 4 KiB)
        expected = rejected_copy(bad[entry_id], copy[b"error"].decode(), INPUTS, entry_id)
        assert {k: str(v).encode() if isinstance(v, int) else v for k, v in expected.items()} == copy, \
            f"rejected copy of {entry_id} is not the entry sent"
    # ... and reported on its session when that is a valid id
    for entry_id, fields in bad.items():
        session = session_of(fields)
        if session is not None:
            codes = ("invalid_input", "too_large", "unauthorized")
            assert any(answered(events_of(r, session), entry_id, "input.refused", c) for c in codes), entry_id

    # every valid entry applied to its session
    store = Store(r, Keys())
    valid = [(c, entry_id, v) for (c, _f), entry_id, v in zip(plan, ids, verdicts, strict=True)
             if isinstance(v, InputEntry)]
    for _category, entry_id, entry in valid:
        state, _version = store.load(entry.session)
        marker = state.applied.get(INPUTS)
        assert marker is not None and entry_key(marker) >= entry_key(entry_id), (entry_id, entry)
    checked: Counter[str] = Counter()
    for category, entry_id, entry in valid:
        session, content = entry.session, getattr(entry.input, "content", None)
        if category == "message.create":
            view = client.show(session)
            assert view is not None and content in [m["content"] for m in view["messages"]]
        elif category == "session.create":
            assert client.show(session) is not None
            assert [e["type"] for e in events_of(r, session)][:1] == ["session.created"]
        elif category == "interrupt.resume":
            assert answered(events_of(r, session), entry_id, "input.ignored", "unknown_interrupt")
        elif category == "branch.switch":
            assert answered(events_of(r, session), entry_id, "input.refused", "unknown_message")
        elif category == "tool.result":
            assert answered(events_of(r, session), entry_id, "input.ignored", "unknown_call")
        elif category == "unknown_parent":
            assert answered(events_of(r, session), entry_id, "input.refused", "unknown_parent")
        elif category == "duplicate":
            assert answered(events_of(r, session), entry_id, "input.ignored", "duplicate")
            view = client.show(session)
            assert view is not None and content not in [m["content"] for m in view["messages"]]
        checked[category] += 1
    for category in ("message.create", "session.create", "interrupt.resume", "branch.switch",
                     "tool.result", "unknown_parent", "duplicate"):
        assert checked[category] > 0, f"the plan produced no {category!r}"

    assert dispatcher.poll() is None and worker.poll() is None
    mutated_valid = sum(1 for c, _e, _v in valid if c in ("mutated", "random"))
    print(f"\n[fuzz] live dispatcher (seed {SEED}): tried={len(plan)} bad={len(bad)} "
          f"rejected={len(rejected)} valid applied={len(valid)} (of which mutated/random but still "
          f"valid: {mutated_valid}; by kind {dict(sorted(checked.items()))}) crashes=0, "
          f"drained in {drained_s:.1f}s")
