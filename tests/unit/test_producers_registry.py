"""The producer registry's model (schemas/producers.py) and the consume loop's fairness rule
(dispatcher/apply.py take_fair): docs/operations.md "Producers", docs/design.md "Consuming streams"."""

import orjson
import pytest

from parley.dispatcher.apply import Held, take_fair
from parley.schemas.producers import (
    Producer,
    ProducerError,
    acl_line,
    check_name,
    new_producer,
    parse_producer,
    parse_registry,
)


@pytest.mark.parametrize("name", ["a", "web-1", "crm_sync", "0x", "a" * 32])
def test_good_producer_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "Web", "a:b", "a*", "-a", "_a", "a" * 33, "a/b", "a b", "é"])
def test_bad_producer_names_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(ProducerError, match="is not a producer name"):
        check_name(name)


def test_a_registration_round_trips_through_its_stored_form() -> None:
    p = new_producer("web", "acme", now_ms=1234)
    assert parse_producer(b"web", p.to_json()) == p
    assert orjson.loads(p.to_json()) == {"tenant": "acme", "added_at": 1234}
    assert parse_producer("any", b'{"tenant": null}') == Producer(name="any")


@pytest.mark.parametrize("tenant", ["", "a/b", "a:b", "a*", "{a}", "x" * 65])
def test_a_bad_tenant_is_refused(tenant: str) -> None:
    with pytest.raises(ProducerError, match="is not a tenant"):
        new_producer("web", tenant)


def test_a_scoped_producer_allows_only_its_tenants_sessions() -> None:
    acme = Producer(name="web", tenant="acme")
    assert acme.allows("acme/s-1")
    assert not acme.allows("globex/s-1")
    assert not acme.allows("s-1")  # a session of no tenant
    assert not acme.allows("acmex/s-1")
    anyone = Producer(name="ops")
    assert anyone.allows("s-1") and anyone.allows("globex/s-1")


def test_unusable_registrations_are_reported_and_the_rest_kept() -> None:
    raw = {b"web": b'{"tenant": "acme"}', b"Bad:Name": b"{}", b"notjson": b"{", b"list": b"[1]",
           b"badtenant": b'{"tenant": "a/b"}'}
    producers, errors = parse_registry(raw)
    assert list(producers) == ["web"] and producers["web"].tenant == "acme"
    assert len(errors) == 4
    assert any("'notjson'" in e for e in errors) and any("'list'" in e for e in errors)


def test_the_acl_line_names_the_producers_own_streams_only() -> None:
    line = acl_line("web", None)
    assert line == ("user parley-producer-web on >change-me resetkeys resetchannels -@all +ping +select "
                    "+wait +hget +hmget %R~parley:config %R~parley:{*}:meta "
                    "(+fcall ~parley:in:web ~parley:in:web:* ~parley:pending:web) "
                    "(+xadd ~parley:in:web ~parley:in:web:*) (+hget +hincrby ~parley:pending:web) "
                    "(+xread +xrange +xrevrange %R~parley:{*}:events %R~parley:{*}:deltas)")
    scoped = acl_line("web", "acme", prefix="p")
    assert "%R~p:{acme/*}:events" in scoped and "%R~p:{acme/*}:meta" in scoped
    assert "%R~p:{acme/*}:deltas" in scoped
    assert "{*}" not in scoped
    with pytest.raises(ProducerError):
        acl_line("web", "a*")


def held(session: str | None, n: int) -> Held:
    return Held(f"1-{n}", {}, None, session)


def test_take_fair_caps_each_session_and_keeps_order() -> None:
    flood = [held("a", i) for i in range(20)]
    other = held("b", 20)
    now, later = take_fair([*flood, other, held(None, 21), held("a", 22)], depth=3)
    assert [h.entry_id for h in now] == ["1-0", "1-1", "1-2", "1-20", "1-21"]
    # what waits keeps its stream order, and none of a's later entries jumps ahead
    assert [h.entry_id for h in later] == [f"1-{i}" for i in range(3, 20)] + ["1-22"]


def test_take_fair_takes_everything_when_no_session_is_over_its_share() -> None:
    entries = [held(s, i) for i, s in enumerate(["a", "b", "a", "c"])]
    assert take_fair(entries, depth=2) == (entries, [])
