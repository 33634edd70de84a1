"""Answering several questions with one form (parley/web/bulk.py) and what the page says once an
answer is delivered (parley/web/followup.py): pure, no Redis."""

import pytest

from parley.client.inbox import OpenInterrupt
from parley.web import bulk, followup
from parley.web.bulk import MAX_PICKS, BulkError, Pick

SCHEMA = {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]}


def row(session: str, interrupt_id: str = "int-1", schema: dict | None = None,
        resumable_by: list[str] | None = None) -> OpenInterrupt:
    return OpenInterrupt(session=session, interrupt_id=interrupt_id, reason="approval", raised_at=1,
                         response_schema=schema, resumable_by=resumable_by)


def test_a_pick_round_trips_any_session_id_and_repeats_count_once() -> None:
    odd = row("acme/ s\x1f\"<x>&", "int-2")
    token = bulk.pick_of(odd)
    assert token.replace("-", "").replace("_", "").isalnum()  # safe in a URL and an attribute
    assert bulk.read_picks([token, token, bulk.pick_of(row("b"))]) == [
        Pick("acme/ s\x1f\"<x>&", "int-2"), Pick("b", "int-1")]


@pytest.mark.parametrize("values, match", [
    ([], "no question is selected"),
    (["not-a-pick!"], "not one the list offered"),
    (["WzEsMl0"], "not one the list offered"),  # [1,2]: not two ids
    ([bulk.token_of(Pick(f"s-{n}", "i")) for n in range(MAX_PICKS + 1)], f"at most {MAX_PICKS} questions"),
])
def test_bad_picks_are_refused_saying_why(values: list[str], match: str) -> None:
    with pytest.raises(BulkError, match=match):
        bulk.read_picks(values)


def test_questions_of_one_schema_share_a_form_and_others_are_grouped_or_set_aside() -> None:
    same = [row("a", schema=SCHEMA), row("b", schema=dict(reversed(list(SCHEMA.items()))))]
    picks = [Pick(r.session, r.interrupt_id) for r in same]
    one = bulk.select(picks, same, lambda r: True)
    assert one.rows == same and one.schema == SCHEMA and not one.set_aside  # key order does not matter

    mixed = [row("a", schema=SCHEMA), row("b"), row("c", schema=SCHEMA), None,
             row("e", resumable_by=["bob"])]
    picks = [Pick(s, "int-1") for s in "abcde"]
    chosen = bulk.select(picks, mixed, lambda r: r.resumable_by is None)
    assert [[r.session for r in g] for g in chosen.groups] == [["a", "c"], ["b"]]
    assert chosen.rows == [] and chosen.schema is None  # two groups: no one form
    assert [(a.pick.session, a.why) for a in chosen.set_aside] == [
        ("d", "no longer open: answered, past its deadline, or closed"), ("e", "you may not answer it")]


def test_each_answer_of_a_bulk_form_has_its_own_key_and_the_same_on_a_second_send() -> None:
    a, b = Pick("s", "int-1"), Pick("s", "int-2")
    assert bulk.idempotency_key("form-1", a) == bulk.idempotency_key("form-1", a)
    assert len({bulk.idempotency_key("form-1", a), bulk.idempotency_key("form-1", b),
                bulk.idempotency_key("form-2", a)}) == 3
    assert len(bulk.idempotency_key("x" * 64, a)) <= 256


def test_the_answer_is_summed_up_as_given() -> None:
    assert followup.answer_summary({"approved": True}) == "Approved"
    assert followup.answer_summary({"approved": False}) == "Declined"
    assert followup.answer_summary({"amount": 5}) == '{\n  "amount": 5\n}'


def test_the_events_after_the_answer_are_found_and_worded() -> None:
    entries = [
        ("1-0", {"type": "interrupt.resumed", "input": {"entry": "9-0"}}),  # another answer
        ("2-0", {"type": "interrupt.resumed", "input": {"entry": "7-0"}, "reason": "approval"}),
        ("3-0", {"type": "tool.started", "name": "send_email"}),
        ("4-0", {"type": "tool.completed", "name": "send_email", "error": "smtp down"}),
        ("5-0", {"type": "message.created", "message": {"role": "assistant", "content": "Sent.\n  Bye"}}),
        ("6-0", {"type": "decision.held"}),  # not for a person
        ("7-0", {"type": "turn.completed"}),
    ]
    found = followup.events_after(entries, "7-0")
    assert found is not None and found[0] == "2-0"
    assert [(e.type, e.text) for e in followup.next_events(found[1])] == [
        ("tool.started", "Tool send_email started"),
        ("tool.completed", "Tool send_email failed: smtp down"),
        ("message.created", "The model replied: Sent. Bye"),
        ("turn.completed", "The turn is complete"),
    ]
    assert followup.events_after(entries, "8-0") is None
    many = [{"type": "tool.started", "name": f"t{n}"} for n in range(20)]
    assert len(followup.next_events(many)) == followup.MAX_NEXT_EVENTS
    calls = {"type": "message.created", "message": {"role": "assistant", "content": "",
                                                    "tool_calls": [{"name": "pay"}, {"name": "log"}]}}
    assert followup.describe(calls) == "The model asks for pay, log"
    assert followup.describe({"type": "message.created", "message": "junk"}) == "Message"
    assert followup.describe({"type": "message.created",
                              "message": {"role": "tool", "content": "x" * 500}}).endswith("…")


def test_an_events_entry_that_holds_no_event_reads_as_none() -> None:
    assert followup.event_of({b"event": b'{"type": "x"}'}) == {"type": "x"}
    assert followup.event_of({b"event": b"[1]"}) is None
    assert followup.event_of({b"event": b"{not json"}) is None
    assert followup.event_of({}) is None and followup.event_of(None) is None


def test_a_flood_of_picks_is_refused_at_the_first_past_the_limit() -> None:
    calls = 0

    def counted(n: int) -> str:
        nonlocal calls
        calls += 1
        return bulk.token_of(Pick(f"s-{n}", "i"))

    with pytest.raises(BulkError, match="at most"):
        bulk.read_picks(counted(n) for n in range(100_000))
    assert calls == MAX_PICKS + 1  # read no further
