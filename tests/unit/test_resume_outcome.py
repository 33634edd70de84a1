"""What a waiting resumer is told (schemas/resumes.py), from the events the core writes."""

from parley.schemas.resumes import ResumeExit, ResumeStatus, is_outcome_of, resume_outcome, timed_out

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
