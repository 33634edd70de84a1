"""Session ids with a tenant (docs/protocol.md, "Ids and limits"; docs/operations.md, "Tenants"):
`acme/s-42` is tenant `acme`'s; its keys keep the whole id as their hash tag, and nothing that
parses ids or members is confused by the `/`."""

import pytest
from redis.crc import key_slot

from parley.client.inbox import InterruptFilter, OpenInterrupt
from parley.schemas.ids import is_child_session, is_session_id, tenant_of
from parley.schemas.keys import Keys, partition_of
from parley.schemas.listing import listing_member, session_of_member

KEYS = Keys()


@pytest.mark.parametrize(("session", "tenant"), [
    ("acme/s-42", "acme"), ("acme/team-a/s-1", "acme"), ("a.b_c-d/x", "a.b_c-d"), ("s-42", None),
    ("acme/s-1:sub-2", "acme"), ("t" * 64 + "/s", "t" * 64),
])
def test_a_session_id_may_carry_a_tenant(session: str, tenant: str | None) -> None:
    assert is_session_id(session) and tenant_of(session) == tenant


@pytest.mark.parametrize("session", ["/s-1", "acme/", "a:b/s-1", "a*/s-1", "a?/s", "a[1]/s", "a{b}/s",
                                     "t" * 65 + "/s-1", "acme /s", "acmé/s"])
def test_a_tenant_is_a_plain_name_and_names_a_session(session: str) -> None:
    assert not is_session_id(session)


def test_a_tenants_sub_agent_child_is_the_tenants_and_the_engines() -> None:
    child = "acme/s-1:sub-3"
    assert is_child_session(child) and tenant_of(child) == "acme"
    assert is_session_id("acme/" + "x" * 120 + ":sub-1:sub-2", producer=False)


def test_a_tenants_session_keys_share_one_slot_the_whole_ids() -> None:
    for session in ("acme/s-1", "acme/s-1:sub-1", "globex/s-1"):
        slots = {key_slot(key.encode()) for key in KEYS.session_keys(session)}
        assert slots == {key_slot(session.encode())}
        assert KEYS.meta(session) == f"parley:{{{session}}}:meta"
    # two sessions of one tenant are not pinned to one slot (nor partition) by the tenant
    assert len({key_slot(f"acme/s-{n}".encode()) for n in range(50)}) > 1
    assert len({partition_of(f"acme/s-{n}", 8) for n in range(50)}) > 1


def test_listing_members_and_the_index_member_keep_the_whole_id() -> None:
    for session in ("acme/s-1", "acme/s-1:sub-1"):
        assert session_of_member(listing_member(1_700_000_000_000, session)) == session
        member = Keys.index_member(session, "int-1")
        assert member.partition("\x1f") == (session, "\x1f", "int-1")


def test_the_session_prefix_filter_selects_one_tenant() -> None:
    def row(session: str) -> OpenInterrupt:
        return OpenInterrupt(session=session, interrupt_id="int-1", reason="r", anchor=None, raised_at=1)

    acme = InterruptFilter(session_prefix="acme/")
    assert [s for s in ("acme/s-1", "acme/s-1:sub-1", "acme2/s-1", "acme", "globex/acme/s")
            if acme.matches(row(s))] == ["acme/s-1", "acme/s-1:sub-1"]
