"""The pure part of `parley notify` (parley/fleet/notify.py): what is posted, its signature, the
receiver's check, the retry schedule, the dead-letter rule, filters and the secret."""

import hashlib
import hmac
from pathlib import Path

import orjson
import pytest

from parley.fleet.notify import (
    FeedEntry,
    FeedEntryError,
    NotifyConfig,
    headers,
    is_dead,
    load_secret,
    parse_entry,
    retry_delay,
    sign,
    stream_ms,
    time_order,
    verify,
    wanted,
)

SECRET = b"s3cret"
EVENT = {"type": "interrupt.raised", "at": 5, "interrupt_id": "int-1", "reason": "approval",
         "payload": {"to": "bob"}, "anchor": "msg-2", "a_field_added_later": 1}
FIELDS = {b"session": b"s-1", b"type": b"interrupt.raised", b"event_id": b"7-0",
          b"event": orjson.dumps(EVENT)}


def test_parse_entry_keeps_the_event_whole() -> None:
    entry = parse_entry(b"12-0", FIELDS)
    assert entry == FeedEntry("12-0", "s-1", "interrupt.raised", "7-0", EVENT)
    assert orjson.loads(entry.body()) == {"id": "12-0", "session": "s-1", "type": "interrupt.raised",
                                          "event_id": "7-0", "event": EVENT}


@pytest.mark.parametrize(("fields", "says"), [
    ({b"session": b"s"}, "lacks type, event_id, event"),
    ({**FIELDS, b"event": b"{not json"}, "event is not JSON"),
    ({**FIELDS, b"event": b"[1]"}, "not a JSON object"),
])
def test_a_malformed_entry_is_a_clear_error(fields: dict[bytes, bytes], says: str) -> None:
    with pytest.raises(FeedEntryError, match=says):
        parse_entry(b"3-0", fields)


def test_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"x":1}'
    expected = hmac.new(SECRET, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1_700_000_000, body) == f"t=1700000000,v1={expected}"


def test_verify_accepts_the_signature_and_refuses_tampering_age_and_garbage() -> None:
    body = b'{"x":1}'
    header = sign(SECRET, 1000, body)
    assert verify(SECRET, header, body, now=1000 + 299)
    assert not verify(SECRET, header, body + b" ", now=1000)  # body changed
    assert not verify(b"other", header, body, now=1000)  # wrong secret
    assert not verify(SECRET, header, body, now=1000 + 301)  # replayed too late
    assert not verify(SECRET, "v1=abc", body, now=1000)
    assert not verify(SECRET, "t=x,v1=abc", body, now=1000)


def test_headers_name_the_delivery_and_the_event() -> None:
    entry = parse_entry(b"12-0", FIELDS)
    body = entry.body()
    h = headers(SECRET, entry, body, now=1000.7)
    assert h["Parley-Delivery"] == "12-0" and h["Parley-Event"] == "interrupt.raised"
    assert verify(SECRET, h["Parley-Signature"], body, now=1000)


def test_retry_delay_grows_jittered_up_to_the_cap() -> None:
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)]:
        draws = [retry_delay(failures, 0.5, 30.0) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > ceiling / 2  # jittered over the whole range, not stuck at 0


def test_an_entry_goes_to_the_dead_letters_after_max_attempts() -> None:
    assert [is_dead(n, 3) for n in (1, 2, 3, 4)] == [False, False, True, True]


def test_type_filter() -> None:
    entry = parse_entry(b"1-0", FIELDS)
    assert wanted(entry, None)
    assert wanted(entry, frozenset({"interrupt.raised"}))
    assert not wanted(entry, frozenset({"turn.completed"}))


def test_the_secret_comes_from_a_file_or_the_environment_and_is_required(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"from-file\n")
    assert load_secret(str(path), "env") == b"from-file"
    assert load_secret(None, "env") == b"env"
    for nothing in (None, ""):
        with pytest.raises(ValueError, match="no webhook secret"):
            load_secret(None, nothing)


def test_the_config_never_shows_its_secret() -> None:
    config = NotifyConfig(url="http://x", secret=b"do-not-log")
    assert "do-not-log" not in repr(config) and "do-not-log" not in str(config)


def test_a_claim_idle_time_a_live_forwarder_could_exceed_is_refused() -> None:
    NotifyConfig(url="http://x", secret=b"k", timeout_s=10, retry_cap_s=30, claim_idle_ms=40_001)
    with pytest.raises(ValueError, match="must exceed the POST timeout plus the longest retry wait"):
        NotifyConfig(url="http://x", secret=b"k", timeout_s=10, retry_cap_s=30, claim_idle_ms=40_000)
    with pytest.raises(ValueError, match="at least 1"):
        NotifyConfig(url="http://x", secret=b"k", max_attempts=0)


def test_the_feeds_of_several_shards_are_posted_in_time_order_ties_by_shard() -> None:
    shard0 = [(b"1000-0", {"n": "a"}), (b"1000-1", {"n": "b"}), (b"3000-0", {"n": "e"})]
    shard1 = [(b"999-5", {"n": "z"}), (b"1000-0", {"n": "c"}), (b"2000-0", {"n": "d"})]
    ordered = time_order([shard0, shard1, []])
    assert [(shard, fields["n"]) for shard, _id, fields in ordered] == [
        (1, "z"), (0, "a"), (0, "b"), (1, "c"), (1, "d"), (0, "e")]
    assert time_order([[], []]) == []
    assert stream_ms("1764558000123-7") == 1764558000123


def test_verify_called_as_the_docs_show_it_uses_the_receivers_clock() -> None:
    """Issue 32: a receiver written from the docs, `verify(secret, header, body)`, crashed: `now`
    was required."""
    import time

    body = b'{"x":1}'
    assert verify(SECRET, sign(SECRET, int(time.time()), body), body)
    assert not verify(SECRET, sign(SECRET, int(time.time()) - 600, body), body)  # ten minutes old
