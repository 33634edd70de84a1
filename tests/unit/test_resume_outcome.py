"""What a waiting resumer is told (schemas/resumes.py), from the events the core writes."""

from parley.schemas.resumes import (
    CLOSE,
    CloseExit,
    CloseStatus,
    ResumeExit,
    ResumeStatus,
    close_timed_out,
    close_told,
    is_outcome_of,
    resume_outcome,
    timed_out,
)

from .harness import Sim


def _outcome_of(s: Sim, entry: str):
    [event] = [e for e in s.last.events if is_outcome_of(entry, e)]  # type: ignore[union-attr]
    return resume_outcome(entry, event)


def test_a_budget_resume_that_leaves_the_limit_spent_is_not_delivered_and_says_why():
    s = Sim()
    iid = s.budget_stopped()
    s.resume(iid, {"budget": {"llm_calls": 0}}, entry_id="4-1")
    outcome = _outcome_of(s, "4-1")
    assert outcome.status is ResumeStatus.NOT_DELIVERED and outcome.exit_code == 3
    assert outcome.message is not None and "limit is still spent" in outcome.message
    assert len(s.core.interrupts) == 1 and iid not in s.core.interrupts  # a new stop is open


def test_a_forbidden_resume_is_refused_with_its_code_and_the_interrupt_stays_open():
    s = Sim()
    s.pause_on_tool("send_email", resumable_by=["alice"])
    s.resume("int-1", {"approved": True}, entry_id="5-1")
    outcome = _outcome_of(s, "5-1")
    assert (outcome.status, outcome.code, outcome.exit_code) == (ResumeStatus.REFUSED, "forbidden", 4)
    assert outcome.describe().startswith("refused forbidden (entry 5-1): ")


def test_other_entries_events_are_not_the_outcome():
    s = Sim()
    s.pause_on_tool("send_email")
    s.resume("int-1", {"approved": True}, entry_id="6-1")
    assert [e["type"] for e in s.last.events if is_outcome_of("6-2", e)] == []  # type: ignore[union-attr]
    assert _outcome_of(s, "6-1").status is ResumeStatus.DELIVERED


def test_every_status_has_its_own_exit_code():
    assert {ResumeExit[st.name].value for st in ResumeStatus} == {0, 3, 4, 5, 6}
    assert timed_out("1-1", 0.5).exit_code == 6


# ---- a close ---------------------------------------------------------------------------------


def _close_outcome_of(s: Sim, entry: str):
    [outcome] = [o for e in s.last.events if (o := close_told(entry, e)) is not None]  # type: ignore[union-attr]
    return outcome


def test_a_close_is_told_by_its_session_closed_and_the_cancelled_interrupts_are_not_the_outcome():
    s = Sim()
    s.pause_on_tool("send_email")
    s.input({"type": "session.close", "reason": "stop"}, entry_id="7-1")
    assert [e["type"] for e in s.last.events] == ["interrupt.cancelled", "session.closed"]  # type: ignore[union-attr]
    outcome = _close_outcome_of(s, "7-1")
    assert (outcome.status, outcome.exit_code) == (CloseStatus.CLOSED, 0)
    assert outcome.describe() == "closed (entry 7-1)"
    assert [e for e in s.last.events if close_told("7-2", e)] == []  # type: ignore[union-attr]


def test_a_second_close_is_ignored_and_a_parent_link_refused():
    s = Sim()
    s.create()
    s.input({"type": "session.close"}, entry_id="8-1")
    s.input({"type": "session.close"}, entry_id="8-2")
    outcome = _close_outcome_of(s, "8-2")
    assert (outcome.status, outcome.code, outcome.exit_code) == (CloseStatus.IGNORED, "session_closed", 5)
    assert outcome.describe() == "ignored session_closed (entry 8-2)"
    other = Sim()
    other.create()
    other.input({"type": "session.close", "parent": {"session": "p", "call_id": "call-1", "attempt": 1}},
                entry_id="9-1")
    refused = _close_outcome_of(other, "9-1")
    assert (refused.status, refused.code, refused.exit_code) == (CloseStatus.REFUSED, "engine_only", 4)
    assert refused.describe().startswith("refused engine_only (entry 9-1): ")


def test_every_close_status_has_the_exit_code_of_the_same_resume_outcome():
    assert {CloseExit[st.name].value for st in CloseStatus} == {0, 4, 5, 6}
    for same in ("REFUSED", "IGNORED", "TIMEOUT"):
        assert CloseExit[same].value == ResumeExit[same].value
    assert close_timed_out("1-1", 0.5).exit_code == 6
    assert CLOSE.timed_out("1-1", 0.5) == close_timed_out("1-1", 0.5)
