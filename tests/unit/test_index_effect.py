"""What the core hands the interrupt index: a row of the listing (docs/protocol.md, "Open
interrupts across sessions"), so the listing reads nothing but the index."""

from tests.unit.harness import Sim


def test_index_add_carries_the_request_deadline_default_principals_and_metadata():
    s = Sim()
    s.open_session(metadata={"team": "a", "ticket": 7})
    s.pause_on_tool("send_email", payload={"to": "bob"}, timeout_s=60, default={"approved": False},
                    resumable_by=["alice"])
    [fx] = s.index_adds()
    assert (fx.payload, fx.default, fx.resumable_by, fx.metadata) == (
        {"to": "bob"}, {"approved": False}, ["alice"], {"team": "a", "ticket": 7})
    assert fx.deadline == fx.raised_at + 60_000


def test_a_budget_stop_is_indexed_with_its_own_payload_and_anyone_may_answer():
    s = Sim()
    s.open_session(budget={"llm_calls": 1})
    s.start("one")
    s.finish_llm(content="first")
    s.settle_decides()
    s.send("two")
    s.settle_decides()
    [fx] = [f for f in s.index_adds() if f.reason == "budget"]
    assert fx.payload is not None and fx.payload == s.ev("interrupt.raised")["payload"]
    assert fx.resumable_by is None and fx.anchor is None
