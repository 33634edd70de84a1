"""The core's typed effects and their stored form, the job table, the codes, the LLM-reply model."""

from typing import Any

import orjson
import pytest

from parley.dispatcher.core import (
    Cancel,
    Close,
    DeadlineAdd,
    DeadlineRemove,
    Effect,
    Enqueue,
    Idle,
    IndexAdd,
    IndexRemove,
    Listing,
    Report,
    Retire,
    Spawn,
    Stat,
    effect_from_dict,
    effect_to_dict,
    effect_to_json,
)
from parley.dispatcher.core.effects import EFFECT_TYPES, split_effects
from parley.schemas.codes import CloseReason, DropReason, EffectKind, IgnoreCode, RefusalCode
from parley.schemas.events import EVENT_ADAPTER
from parley.schemas.inputs import ParentLink
from parley.schemas.jobs import ALLOWED_FUNCS, JOBS, KIND_OF_QUEUE, JobKind, job_id
from parley.schemas.listing import ListingStatus
from parley.schemas.llm import InvalidLlmReply, LlmReply, parse_llm_reply
from parley.schemas.results import WorkOutcome
from parley.workers.jobs import JobFailure, check_response

from .harness import MALFORMED_REPLIES, Sim

ONE_OF_EACH: list[Effect] = [
    Enqueue(seq=1, job=JobKind.LLM, work="llm-1", attempt=2, timeout=120, reply_to="parley:results",
            app="helper", args={"request": {"messages": []}}),
    Cancel(seq=2, job=JobKind.DECIDE, work="dec-3", attempt=1),
    IndexAdd(seq=3, interrupt_id="int-1", reason="confirm", anchor="msg-2", raised_at=5, deadline=None,
             parent=None),
    IndexRemove(seq=4, interrupt_id="int-1"),
    Spawn(seq=5, child="s:sub-1", content="{}", parent=ParentLink(
        session="s", call_id="call-1", attempt=1, app="helper", reply_to="parley:results")),
    Report(seq=6, stream="parley:results", outcome=WorkOutcome(
        session="s", work="call-1", attempt=1, kind="tool", ok=True, value="done", source="s:sub-1")),
    Stat(seq=7, field="held", delta=-1),
    Close(seq=8, child="s:sub-1", call_id="call-1", attempt=1, reason=CloseReason.TIMEOUT),
    DeadlineAdd(seq=9, timer="call-1/timeout", at=1_000),
    DeadlineRemove(seq=10, timer="call-1/timeout"),
    Retire(seq=11, closed_at=1_000, expires_at=2_000),
    Idle(seq=12, at=3_000),
    Listing(seq=13, created_at=5, before=ListingStatus.ACTIVE, after=ListingStatus.PARKED,
            added=(("team", "a"),), removed=(("team", "b"),)),
]


@pytest.mark.parametrize("fx", ONE_OF_EACH, ids=lambda fx: fx.op)
def test_every_effect_round_trips_through_its_stored_form(fx: Effect):
    stored = orjson.loads(effect_to_json(fx))
    assert stored == effect_to_dict(fx)
    assert stored["op"] == fx.op and stored["seq"] == fx.seq
    assert effect_from_dict(stored) == fx


def test_each_effect_kind_has_one_class():
    assert set(EFFECT_TYPES) == set(EffectKind) == {fx.op for fx in ONE_OF_EACH}
    assert all(type(fx) is EFFECT_TYPES[fx.op] for fx in ONE_OF_EACH)


def test_effects_say_which_job_never_how_rq_names_it():
    """The core's Enqueue and Cancel carry (kind, work, attempt): the job id and function are
    the shell's, from the one job table."""
    stored = effect_to_dict(ONE_OF_EACH[0]) | effect_to_dict(ONE_OF_EACH[1])
    assert not {"job_id", "func", "queue"} & set(stored)


# ---- outbox records written before effects were typed --------------------------------------------


def test_an_old_enqueue_record_reads_as_the_enqueue_it_was():
    old = {"seq": 4, "op": "enqueue", "queue": "tools", "func": "parley.workers.jobs.run_tool",
           "job_id": job_id("s1", "call-2", 1), "timeout": 30,
           "payload": {"session": "s1", "work": "call-2", "attempt": 1, "reply_to": "parley:results:2",
                       "app": None, "name": "search", "arguments": {"q": "x"}}}
    fx = effect_from_dict(old)
    assert fx == Enqueue(seq=4, job=JobKind.TOOL, work="call-2", attempt=1, timeout=30,
                         reply_to="parley:results:2", app=None,
                         args={"name": "search", "arguments": {"q": "x"}})
    assert JOBS[fx.job].func == old["func"] and job_id("s1", fx.work, fx.attempt) == old["job_id"]


def test_an_old_cancel_record_reads_as_a_cancel_of_nothing():
    fx = effect_from_dict({"seq": 9, "op": "cancel", "queue": "llm", "job_id": job_id("s1", "llm-1", 1)})
    assert isinstance(fx, Cancel) and fx.seq == 9 and fx.job is JobKind.LLM
    assert job_id("s1", fx.work, fx.attempt) != job_id("s1", "llm-1", 1)


def test_other_old_records_are_already_in_the_new_form():
    for old in ({"seq": 1, "op": "index_remove", "interrupt_id": "int-1"},
                {"seq": 2, "op": "stat", "field": "held", "delta": 1},
                {"seq": 3, "op": "index_add", "interrupt_id": "int-2", "reason": "budget", "anchor": None,
                 "raised_at": 7, "deadline": 9, "parent": "p"}):
        # an older index_add lacks what the listing shows besides: it reads as unknown (null)
        listing = ({"payload": None, "default": None, "resumable_by": None, "metadata": None,
                    "response_schema": None} if old["op"] == "index_add" else {})
        assert effect_to_dict(effect_from_dict(old)) == old | listing


# ---- the job table -------------------------------------------------------------------------------


def test_the_job_table_is_the_allowlist_and_covers_every_kind():
    assert set(JOBS) == set(JobKind)
    assert {spec.func for spec in JOBS.values()} == ALLOWED_FUNCS
    assert {KIND_OF_QUEUE[spec.queue] for spec in JOBS.values()} == set(JobKind)
    assert {kind.value for kind in JobKind} == {"decide", "llm", "tool"}  # WorkOutcome.kind values


def test_job_ids_use_rq_alphabet_and_differ_per_attempt():
    ids = {job_id("a:b/c d", "call-1", n) for n in (1, 2, 3)}
    assert len(ids) == 3
    assert all(i.startswith("parley-") and i.replace("-", "").replace("_", "").isalnum() for i in ids)


# ---- codes ---------------------------------------------------------------------------------------


def test_codes_are_their_wire_strings():
    assert RefusalCode.BRANCH_PARKED == "branch_parked" and f"{IgnoreCode.DUPLICATE}" == "duplicate"
    assert orjson.dumps({"code": DropReason.STALE_ATTEMPT}) == b'{"code":"stale_attempt"}'


def test_refused_and_ignored_events_take_only_their_codes():
    ref = {"entry": "1-1", "type": "message.create"}
    EVENT_ADAPTER.validate_python({"type": "input.refused", "at": 1, "input": ref,
                                   "code": "turn_in_progress", "message": "m"})
    EVENT_ADAPTER.validate_python({"type": "input.ignored", "at": 1, "input": ref, "code": "duplicate"})
    with pytest.raises(ValueError):
        EVENT_ADAPTER.validate_python({"type": "input.refused", "at": 1, "input": ref,
                                       "code": "duplicate", "message": "m"})


def test_codes_the_core_gives_are_members_of_their_enums():
    s = Sim()
    s.send("hi")
    s.send("again", key="k", duplicate=True)
    s.send("child", parent="nope")
    codes = [(e["type"], e["code"]) for e in s.events if e["type"].startswith("input.")]
    assert codes == [("input.ignored", IgnoreCode.DUPLICATE), ("input.refused", RefusalCode.UNKNOWN_PARENT)]
    assert all(type(code) in (IgnoreCode, RefusalCode) for _t, code in codes)


# ---- one LLM-reply model for the worker and the core ---------------------------------------------


@pytest.mark.parametrize("value", MALFORMED_REPLIES)
def test_worker_and_core_refuse_a_bad_reply_with_one_error(value: Any):
    with pytest.raises(JobFailure) as worker:
        check_response(value)
    s = Sim()
    s.start("x")
    s.finish_llm("llm-1", value=value)
    assert s.ev("llm.failed")["error"] == str(worker.value)
    assert str(worker.value).startswith("invalid model response: ")


def test_a_reply_with_nulls_reads_as_empty_and_keeps_usage_only_as_an_object():
    empty = {"content": "", "tool_calls": []}
    assert check_response({"content": None, "tool_calls": None, "usage": 7}) == empty
    reply = parse_llm_reply({"tool_calls": [{"name": "search", "arguments": None, "extra": 1}],
                             "usage": {"tokens": 12}, "model": "ignored"})
    assert reply == LlmReply(tool_calls=[{"name": "search"}], usage={"tokens": 12})  # type: ignore[list-item]
    assert reply.to_wire() == {"content": "", "tool_calls": [{"id": None, "name": "search", "arguments": {}}],
                               "usage": {"tokens": 12}}
    assert reply.tokens == 12 and parse_llm_reply({"usage": {"tokens": True}}).tokens == 0
    with pytest.raises(InvalidLlmReply, match=r"at tool_calls\.0\.name$"):
        parse_llm_reply({"tool_calls": [{"name": ""}]})


# ---- split_effects: which jobs the commit script enqueues itself ------------------------------


def _job(seq: int, work: str, attempt: int = 1) -> Enqueue:
    return Enqueue(seq=seq, job=JobKind.LLM, work=work, attempt=attempt, timeout=60,
                   reply_to="parley:results", app=None, args={})


def _cancel(seq: int, work: str, attempt: int = 1) -> Cancel:
    return Cancel(seq=seq, job=JobKind.LLM, work=work, attempt=attempt)


def test_split_effects_sends_jobs_to_the_commit_and_the_rest_to_the_outbox_in_order():
    stat, listing = Stat(seq=2, field="x", delta=1), ONE_OF_EACH[-1]
    jobs, rest = split_effects([_job(1, "llm-1"), stat, _job(3, "tool-1"), listing])
    assert [fx.seq for fx in jobs] == [1, 3]
    assert rest == [stat, listing]


def test_a_cancel_of_an_earlier_transitions_job_stays_in_the_outbox():
    jobs, rest = split_effects([_cancel(1, "llm-1"), _job(2, "llm-2")])
    assert [fx.seq for fx in jobs] == [2] and [fx.seq for fx in rest] == [1]


def test_a_job_enqueued_then_cancelled_in_one_transition_is_neither():
    # the cancel would come a settle later than the commit's enqueue: a worker could take a void job
    other = _job(4, "llm-1", attempt=2)  # another attempt is another job
    jobs, rest = split_effects([_job(1, "llm-1"), Stat(seq=2, field="x", delta=1), _cancel(3, "llm-1"),
                                other])
    assert jobs == [other]
    assert [fx.seq for fx in rest] == [2]


def test_a_second_cancel_of_a_dropped_job_is_kept():
    jobs, rest = split_effects([_job(1, "llm-1"), _cancel(2, "llm-1"), _cancel(3, "llm-1")])
    assert jobs == [] and [fx.seq for fx in rest] == [3]


def test_a_job_asked_for_again_after_its_cancel_keeps_the_outbox_order():
    # cancel, then the same job id enqueued: done in the outbox, in that order (the job ends queued)
    jobs, rest = split_effects([_cancel(1, "llm-1"), _job(2, "llm-1")])
    assert jobs == [] and [fx.seq for fx in rest] == [1, 2]
