"""Inputs, refusals and ignores (docs/protocol.md, Inputs, Order of checks, Events) and triggers,
proposed and actions (docs/protocol.md, Triggers, Actions) on the pure core, without interrupts
(those are in test_interrupts.py)."""

import pytest

from parley.cli.transcript import format_transcript
from parley.dispatcher.core import AppInfo
from parley.schemas.jobs import JOBS

from .harness import Sim, make_app

# ---- session.create / implicit creation ---------------------------------------------------------


def test_session_create_fires_session_created_event_and_trigger():
    s = Sim()
    s.create(budget={"llm_calls": 3}, metadata={"user": "ann"})
    assert s.types() == ["session.created"]
    ev = s.ev("session.created")
    assert ev["budget"] == {"llm_calls": 3} and ev["metadata"] == {"user": "ann"}
    [job] = s.enqueued("decide")
    trigger = job.args["trigger"]
    assert trigger == {"type": "session.created", "session": "s1", "head": None,
                       "budget": {"llm_calls": 3}, "metadata": {"user": "ann"}}
    assert job.args["proposed"] == {"actions": []}
    assert job.work == "dec-1" and job.attempt == 1
    assert job.job == "decide" and JOBS[job.job].func == "parley.workers.jobs.run_decide"
    s.decide()
    assert s.types() == [] and s.deciding is None
    assert s.show() == {"session": "s1", "status": "active", "closed_at": None, "head": None,
                        "parked": False, "messages": [], "interrupts": [], "pending": [], "children": [],
                        "parent": None}


def test_session_create_on_existing_session_is_ignored_session_exists():
    s = Sim()
    s.create(metadata={"a": 1})
    s.decide()
    tr = s.create(metadata={"b": 2}, entry_id="7-0")
    assert s.types() == ["input.ignored"]
    ev = s.ev("input.ignored")
    assert ev["code"] == "session_exists"
    assert ev["input"] == {"entry": "7-0", "type": "session.create"}
    assert s.core.metadata == {"a": 1}
    assert tr.effects == []


def test_session_create_after_implicit_creation_is_ignored():
    s = Sim()
    s.send("hello")
    s.create()
    assert s.ev("input.ignored")["code"] == "session_exists"


def test_implicit_creation_fires_session_created_before_message_created():
    s = Sim()
    s.send("hello")
    assert s.types() == ["session.created", "message.created"]
    assert s.ev("session.created") | {"at": 0} == {
        "type": "session.created", "at": 0,
        "input": {"entry": "1-1", "type": "message.create"}}  # the entry that created it
    # Triggers are decided one at a time in the order fired: session.created first.
    assert s.enqueued_work("decide") == ["dec-1"]
    assert s.trigger["type"] == "session.created"
    s.decide()
    assert s.trigger["type"] == "message.created"
    assert s.trigger["message"] == {"id": "msg-1", "parent_id": None, "role": "user",
                                    "content": "hello"}
    assert s.trigger["head"] == "msg-1"
    assert s.proposed == [{"type": "llm.call"}]


def test_session_created_decision_acting_on_a_branch_is_invalid():
    s = Sim()
    s.create()
    s.decide([{"type": "message", "content": "hi"}])
    assert s.types() == ["decision.failed"]
    assert s.ev("decision.failed")["trigger"] == {"type": "session.created"}
    assert s.state.messages == {}


# ---- message.create -----------------------------------------------------------------------------


def test_first_message_is_a_root_and_moves_the_head():
    s = Sim()
    s.send("hello")
    msg = s.ev("message.created")["message"]
    assert msg == {"id": "msg-1", "parent_id": None, "role": "user", "content": "hello"}
    assert s.head == "msg-1"


def test_message_with_parent_omitted_goes_under_the_active_head():
    s = Sim()
    s.start("one")
    s.finish_llm(content="answer")
    s.decide(expect="llm.completed")
    assert s.head == "msg-2"
    s.send("two")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-2"
    assert s.head == "msg-3"


def test_message_with_explicit_parent_forks_there():
    s = Sim()
    s.start("one")
    s.finish_llm(content="answer")
    s.decide()
    s.send("edit of the reply's question", parent="msg-1")
    msg = s.ev("message.created")["message"]
    assert msg["parent_id"] == "msg-1" and msg["id"] == "msg-3"
    assert s.head == "msg-3"
    s.decide(expect="message.created")
    # the model sees the branch root -> head, not the sibling reply
    [job] = s.enqueued("llm")
    assert [m["id"] for m in s.llm_request(job)["messages"]] == ["msg-1", "msg-3"]


def test_message_with_null_parent_is_a_new_root():
    s = Sim()
    s.start("one")
    s.finish_llm(content="answer")
    s.decide()
    s.send("again", parent=None)
    msg = s.ev("message.created")["message"]
    assert msg["parent_id"] is None and s.head == msg["id"]


def test_message_with_unknown_parent_is_refused():
    s = Sim()
    s.start("one")
    s.finish_llm(content="answer")
    s.decide()
    before = dict(s.state.messages)
    tr = s.send("x", parent="msg-99", message_id="mine", entry_id="5-1")
    assert s.types() == ["input.refused"]
    ev = s.ev("input.refused")
    assert ev["code"] == "unknown_parent"
    assert ev["input"] == {"entry": "5-1", "type": "message.create", "parent_id": "msg-99",
                           "message_id": "mine"}
    assert "interrupt_ids" not in ev
    assert s.state.messages == before and tr.effects == [] and s.head == "msg-2"


def test_message_at_the_tip_of_a_running_turn_is_refused_turn_in_progress():
    s = Sim()
    s.start("one")  # llm-1 running: msg-1 is the tip of a running turn
    s.send("two")
    assert s.ev("input.refused")["code"] == "turn_in_progress"
    s.send("two", parent="msg-1")
    assert s.ev("input.refused")["code"] == "turn_in_progress"
    s.finish_llm(content="answer")
    # still running until the decision of llm.completed is applied
    s.send("two")
    assert s.ev("input.refused")["code"] == "turn_in_progress"
    s.decide(expect="llm.completed")
    s.send("two")
    assert s.types() == ["message.created"]


def test_message_forking_inside_a_running_turn_is_not_turn_in_progress():
    s = Sim()
    s.start("one")
    s.reply_tools("search")  # turn tip is msg-2; msg-1 is inside the turn, not its tip
    s.send("other", parent="msg-1")
    assert s.types() == ["message.created"]


def test_message_with_used_message_id_is_refused_duplicate_message_id():
    s = Sim()
    s.start("one", message_id="q1")
    s.finish_llm(content="answer")
    s.decide()
    s.send("again", parent=None, message_id="q1")
    ev = s.ev("input.refused")
    assert ev["code"] == "duplicate_message_id" and ev["input"]["message_id"] == "q1"
    s.send("again", parent=None, message_id="msg-1")  # the reply's engine-minted id
    assert s.ev("input.refused")["code"] == "duplicate_message_id"


def test_refusal_order_turn_in_progress_before_duplicate_message_id():
    s = Sim()
    s.start("one", message_id="q1")
    s.send("two", message_id="q1")
    assert s.ev("input.refused")["code"] == "turn_in_progress"


def test_refusal_order_unknown_parent_first():
    s = Sim()
    s.start("one", message_id="q1")
    s.send("two", parent="nope", message_id="q1")
    assert s.ev("input.refused")["code"] == "unknown_parent"


def test_client_message_id_is_used_and_minting_skips_it():
    s = Sim()
    s.start("one", message_id="msg-2")
    assert s.head == "msg-2"
    s.finish_llm(content="a")
    assert s.ev("message.created")["message"]["id"] == "msg-1"
    s.decide()
    s.send("two")
    # msg-2 is the client's: the engine goes on with msg-3
    assert s.ev("message.created")["message"]["id"] == "msg-3"
    s.decide()
    s.finish_llm(content="b")
    assert s.ev("message.created")["message"]["id"] == "msg-4"


# ---- branch.switch ------------------------------------------------------------------------------


def test_switch_to_unknown_message_is_refused():
    s = Sim()
    s.start("one")
    s.switch("msg-9", entry_id="3-3")
    ev = s.ev("input.refused")
    assert ev["code"] == "unknown_message"
    assert ev["input"] == {"entry": "3-3", "type": "branch.switch", "head": "msg-9"}
    assert s.head == "msg-1"


def test_switch_on_missing_session_is_refused_unknown_message():
    s = Sim()
    tr = s.switch("msg-1")
    assert s.ev("input.refused")["code"] == "unknown_message"
    assert tr.state.core is None


def test_switch_moves_the_head_and_next_message_goes_there():
    s = Sim()
    s.start("one")
    s.finish_llm(content="a")
    s.decide()
    s.switch("msg-1")
    assert s.ev("branch.switched") | {"at": 0} == {
        "type": "branch.switched", "at": 0, "head": "msg-1", "parked": False, "interrupt_ids": [],
        "input": {"entry": "1-2", "type": "branch.switch", "head": "msg-1"}}
    assert s.head == "msg-1" and s.show()["head"] == "msg-1"
    s.send("other")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-1"


# ---- idempotency ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    {"type": "message.create", "content": "x"},
    {"type": "session.create"},
    {"type": "interrupt.resume", "interrupt_id": "int-1"},
    {"type": "branch.switch", "head": "msg-1"},
    {"type": "tool.result", "call_id": "call-1", "result": 1},
])
def test_duplicate_idempotency_key_is_ignored(value):
    s = Sim()
    s.start("one")
    before = s.state
    tr = s.input(value, key="k1", duplicate=True, entry_id="9-9")
    assert s.types() == ["input.ignored"]
    ev = s.ev("input.ignored")
    assert ev["code"] == "duplicate"
    assert ev["input"]["entry"] == "9-9" and ev["input"]["type"] == value["type"]
    assert tr.effects == [] and tr.new_messages == []
    assert s.state.core == before.core
    assert tr.idempotency_key == "k1"


def test_transition_carries_the_idempotency_key():
    s = Sim()
    tr = s.send("one", key="producer-key-1")
    assert tr.idempotency_key == "producer-key-1"
    assert s.send("two", parent=None).idempotency_key is None


# ---- the LLM --------------------------------------------------------------------------------------


def test_message_created_proposes_llm_call_which_starts_with_the_branch():
    s = Sim()
    s.start("hello")
    assert s.types() == ["llm.started"]
    assert s.ev("llm.started") | {"at": 0} == {"type": "llm.started", "at": 0, "call_id": "llm-1",
                                               "head": "msg-1"}
    [job] = s.enqueued("llm")
    assert JOBS[job.job].func == "parley.workers.jobs.run_llm" and (job.work, job.attempt) == ("llm-1", 1)
    assert job.timeout == 120
    assert s.llm_request(job) == {"messages": [
        {"id": "msg-1", "parent_id": None, "role": "user", "content": "hello"}]}
    assert s.show()["pending"] == [{"call_id": "llm-1", "kind": "llm", "name": None}]


def test_llm_call_action_passes_model_and_params():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "llm.call", "model": "big", "params": {"temperature": 0}}])
    req = s.llm_request(s.enqueued("llm")[0])
    assert req["model"] == "big" and req["params"] == {"temperature": 0}


def test_llm_reply_without_tool_calls_fires_llm_completed_and_ends_the_turn():
    s = Sim()
    s.start("hello")
    s.finish_llm(content="hi there")
    assert s.types() == ["message.created", "llm.completed"]
    msg = s.ev("message.created")["message"]
    assert msg == {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "hi there"}
    assert s.ev("llm.completed") | {"at": 0} == {"type": "llm.completed", "at": 0, "call_id": "llm-1",
                                                 "head": "msg-1", "message_id": "msg-2"}
    assert s.trigger == {"type": "llm.completed", "session": "s1", "head": "msg-2", "message": msg}
    assert s.proposed == []
    assert "turn.completed" not in s.types()  # not before the decision of llm.completed
    s.decide()
    assert s.types() == ["turn.completed"]
    assert s.ev("turn.completed")["head"] == "msg-2"
    assert s.core.turns == {} and s.show()["pending"] == []


def test_llm_reply_with_two_tool_calls_fires_two_tool_executes_in_order_with_call_ids():
    s = Sim()
    s.start("hello")
    s.finish_llm(content="on it", tool_calls=[
        {"id": "toolu_A", "name": "search", "arguments": {"q": "a"}},
        {"id": "toolu_B", "name": "send_email", "arguments": {"to": "bob"}},
    ])
    msg = s.ev("message.created")["message"]
    # docs/protocol.md, Messages: the model's own ids are rewritten to call-N in the stored message
    assert msg["tool_calls"] == [
        {"id": "call-1", "name": "search", "arguments": {"q": "a"}},
        {"id": "call-2", "name": "send_email", "arguments": {"to": "bob"}},
    ]
    assert s.msg("msg-2")["tool_calls"][0]["id"] == "call-1"
    assert s.trigger == {"type": "tool.execute", "session": "s1", "head": "msg-2",
                         "call_id": "call-1", "name": "search", "arguments": {"q": "a"}}
    assert s.proposed == [{"type": "tool.execute"}]
    s.decide()
    assert s.types() == ["tool.started"]
    assert s.ev("tool.started") | {"at": 0} == {"type": "tool.started", "at": 0, "call_id": "call-1",
                                                "name": "search"}
    [job] = s.enqueued("tool")
    assert job.args["name"] == "search" and job.args["arguments"] == {"q": "a"}
    assert job.work == "call-1" and job.attempt == 1
    assert JOBS[job.job].func == "parley.workers.jobs.run_tool" and job.timeout == 300
    assert s.trigger["type"] == "tool.execute" and s.trigger["call_id"] == "call-2"
    assert s.trigger["arguments"] == {"to": "bob"}
    s.decide()
    assert s.enqueued("tool")[0].timeout == 30  # the tool's own timeout_s
    assert [p["call_id"] for p in s.show()["pending"]] == ["call-1", "call-2"]


def test_tool_completed_pending_and_llm_call_only_when_nothing_pending():
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(calls[1], result={"hits": 2})
    assert s.types() == ["message.created", "tool.completed"]
    tool_msg = s.ev("message.created")["message"]
    assert tool_msg == {"id": "msg-3", "parent_id": "msg-2", "role": "tool",
                        "content": '{"hits":2}', "tool_call_id": "call-2"}
    assert s.ev("tool.completed") | {"at": 0} == {"type": "tool.completed", "at": 0,
                                                  "call_id": "call-2", "name": "search",
                                                  "message_id": "msg-3"}
    assert s.trigger["type"] == "tool.completed"
    assert s.trigger["pending"] == ["call-1"] and s.trigger["result"] == {"hits": 2}
    assert s.proposed == []
    s.decide()
    assert s.enqueued() == [] and s.types() == []
    s.finish_tool(calls[0], result="plain text")
    assert s.ev("message.created")["message"]["content"] == "plain text"
    assert s.trigger["pending"] == [] and s.proposed == [{"type": "llm.call"}]
    s.decide()
    assert s.enqueued_work("llm") == ["llm-2"]
    req = s.llm_request(s.enqueued("llm")[0])
    assert [m["id"] for m in req["messages"]] == ["msg-1", "msg-2", "msg-3", "msg-4"]


def test_pending_lists_llm_calls_too():
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(calls[0])
    s.decide([{"type": "llm.call"}])  # the app starts the model early
    s.finish_tool(calls[1])
    assert s.trigger["pending"] == ["llm-2"] and s.proposed == []


def test_tool_error_outcome_is_recorded_as_tool_error_message():
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools("search")
    s.decide()
    s.finish_tool(call, error="ConnectionError: down")
    msg = s.ev("message.created")["message"]
    assert msg["role"] == "tool" and msg["error"] is True
    assert msg["content"] == "ConnectionError: down" and msg["tool_call_id"] == call
    assert s.ev("tool.completed")["error"] == "ConnectionError: down"
    assert s.trigger["error"] == "ConnectionError: down" and "result" not in s.trigger
    assert s.proposed == [{"type": "llm.call"}]


def test_tool_execute_with_a_name_of_the_workers_own_appends_assistant_message_first():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "tool.execute", "name": "search", "arguments": {"q": "z"}}],
             expect="message.created")
    assert s.types() == ["message.created", "tool.started"]
    msg = s.ev("message.created")["message"]
    assert msg == {"id": "msg-2", "parent_id": "msg-1", "role": "assistant", "content": "",
                   "tool_calls": [{"id": "call-1", "name": "search", "arguments": {"q": "z"}}]}
    assert s.ev("tool.started")["call_id"] == "call-1"
    assert s.enqueued("tool")[0].args["arguments"] == {"q": "z"}
    assert s.head == "msg-2"
    s.finish_tool("call-1", result="r")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-2"
    assert s.trigger["type"] == "tool.completed" and s.proposed == [{"type": "llm.call"}]


def test_tool_result_action_settles_the_call_without_running_it():
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools("send_email")
    s.decide([{"type": "tool.result", "result": {"sent": False}}])
    assert s.types() == ["message.created", "tool.completed"]
    assert s.ev("message.created")["message"]["content"] == '{"sent":false}'
    assert s.enqueued("tool") == [] and "tool.started" not in s.types()
    assert s.trigger["type"] == "tool.completed" and s.trigger["call_id"] == call
    assert s.trigger["result"] == {"sent": False}


def test_tool_error_action_settles_the_call_with_an_error():
    s = Sim()
    s.start("hello")
    [_call] = s.reply_tools("send_email")
    s.decide([{"type": "tool.error", "error": "not allowed"}])
    msg = s.ev("message.created")["message"]
    assert msg["error"] is True and msg["content"] == "not allowed"
    assert s.ev("tool.completed")["error"] == "not allowed"
    assert s.trigger["error"] == "not allowed"


def test_tool_result_action_with_explicit_call_id_settles_that_call():
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide([{"type": "tool.result", "call_id": calls[1], "result": "b"},
              {"type": "tool.result", "result": "a"}])
    assert [e["call_id"] for e in s.of("tool.completed")] == [calls[1], calls[0]]
    # call-2's tool.execute is still queued; its call is settled, so proposed is invalid now
    assert s.trigger["type"] == "tool.execute" and s.trigger["call_id"] == calls[1]
    s.decide()
    assert s.ev("decision.failed")["trigger"] == {"type": "tool.execute", "call_id": calls[1]}


def test_message_action_appends_an_assistant_message_without_the_model():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "message", "content": "canned"}])
    assert s.types() == ["message.created", "turn.completed"]
    assert s.ev("message.created")["message"] == {"id": "msg-2", "parent_id": "msg-1",
                                                  "role": "assistant", "content": "canned"}
    assert s.enqueued() == [] and s.head == "msg-2"
    assert s.ev("turn.completed")["head"] == "msg-2"


def test_unknown_tool_settles_the_call_as_unknown_tool():
    s = Sim()
    s.start("hello")
    [_call] = s.reply_tools("no_such_tool")
    s.decide()
    assert s.types() == ["message.created", "tool.completed"]
    assert s.ev("tool.completed")["error"] == "unknown_tool"
    assert s.ev("message.created")["message"]["content"] == "unknown_tool"
    assert s.enqueued("tool") == []
    assert s.trigger["type"] == "tool.completed" and s.trigger["error"] == "unknown_tool"


def test_unknown_tool_by_name_of_the_workers_own():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "tool.execute", "name": "nope"}])
    assert s.types() == ["message.created", "message.created", "tool.completed"]
    assert s.ev("tool.completed")["error"] == "unknown_tool"


def test_failed_decide_of_tool_execute_settles_the_call_decision_failed():
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools("send_email")
    s.decide_fail("Traceback: KeyError")
    assert s.types() == ["decision.failed", "message.created", "tool.completed"]
    ev = s.ev("decision.failed")
    assert ev["trigger"] == {"type": "tool.execute", "call_id": call}
    assert ev["error"] == "Traceback: KeyError"
    assert s.ev("tool.completed")["error"] == "decision_failed"
    assert s.ev("message.created")["message"]["error"] is True
    assert s.trigger["type"] == "tool.completed" and s.proposed == [{"type": "llm.call"}]


def test_failed_decide_of_message_created_ends_the_turn():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide_fail("timeout")
    assert s.types() == ["decision.failed", "turn.completed"]
    assert s.ev("decision.failed")["trigger"] == {"type": "message.created", "message_id": "msg-1"}
    assert s.ev("turn.completed")["head"] == "msg-1"


def _to_tool_execute() -> Sim:
    s = Sim()
    s.start("hello")
    s.reply_tools("send_email")
    return s


@pytest.mark.parametrize(("value", "fragment"), [
    ({"actions": [{"type": "interrupt"}]}, "reason"),  # pydantic: reason is required
    ({"actions": [{"type": "interrupt", "reason": ""}]}, "reason"),
    ({"actions": [{"type": "interrupt", "reason": "x"}, {"type": "llm.call"}]},
     "only recording actions may follow an interrupt"),
    ({"actions": [{"type": "interrupt", "reason": "x"}, {"type": "tool.execute"}]},
     "only recording actions may follow an interrupt"),
    ({"actions": [{"type": "interrupt", "reason": "x"}, {"type": "interrupt", "reason": "y"}]},
     "only recording actions may follow an interrupt"),
    ({"actions": [{"type": "tool.execute"}, {"type": "tool.execute"}]}, "not waiting to run"),
    ({"actions": [{"type": "tool.result", "result": 1}, {"type": "tool.result", "result": 2}]},
     "is not open"),
    ({"actions": [{"type": "tool.result", "call_id": "call-7", "result": 1}]}, "is not open"),
    # arguments without a name used to run the original call with its original arguments
    ({"actions": [{"type": "tool.execute", "arguments": {"to": "eve@example.com"}}]},
     "`arguments` needs a `name`"),
    ({"actions": [{"type": "tool.execute", "call_id": "call-1", "name": "search"}]},
     "`call_id` and `name` exclude each other"),
    ({"actions": [{"type": "explode"}]}, "invalid decision"),
    ({"actions": [{"type": "llm.call", "temperature": 1}]}, "invalid decision"),
    ({"actions": [], "extra": 1}, "invalid decision"),
    (None, "decide returned None"),
])
def test_invalid_decision_applies_nothing_and_fails(value, fragment):
    s = _to_tool_execute()
    s.decide(value=value)
    ev = s.ev("decision.failed")
    assert fragment in ev["error"]
    assert "interrupt.raised" not in s.types() and "tool.started" not in s.types()
    assert s.enqueued("tool") == [] and s.enqueued("llm") == []
    assert s.core.interrupts == {}
    # the tool.execute's call is settled as decision_failed (docs/protocol.md, Triggers)
    assert s.ev("tool.completed")["error"] == "decision_failed"


def test_invalid_decision_is_validated_whole_before_anything_applies():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "message", "content": "first"}, {"type": "tool.result", "result": 1}],
             expect="message.created")
    assert s.types() == ["decision.failed", "turn.completed"]
    assert "no call to settle" in s.ev("decision.failed")["error"]
    assert list(s.state.messages) == ["msg-1"]


def test_tool_execute_without_call_on_message_created_is_invalid():
    s = Sim()
    s.send("hello")
    s.decide()
    s.decide([{"type": "tool.execute"}])
    assert "not waiting to run" in s.ev("decision.failed")["error"]


def test_decision_may_be_a_bare_list_of_actions():
    s = _to_tool_execute()
    s.decide(value=[{"type": "tool.result", "result": "ok"}])
    assert s.ev("tool.completed")["call_id"] == "call-1" and "error" not in s.ev("tool.completed")


# ---- llm.failed ---------------------------------------------------------------------------------


def test_llm_failure_fires_llm_failed_and_the_turn_ends():
    s = Sim()
    s.start("hello")
    s.finish_llm(ok=False, error="rate limited")
    assert s.types() == ["llm.failed"]
    assert s.ev("llm.failed") | {"at": 0} == {"type": "llm.failed", "at": 0, "call_id": "llm-1",
                                              "head": "msg-1", "error": "rate limited"}
    assert s.trigger == {"type": "llm.failed", "session": "s1", "head": "msg-1",
                         "call_id": "llm-1", "error": "rate limited"}
    assert s.proposed == []
    s.decide()
    assert s.types() == ["turn.completed"]
    assert s.ev("turn.completed")["head"] == "msg-1"


def test_llm_failed_may_be_retried_by_the_app():
    s = Sim()
    s.start("hello")
    s.finish_llm(ok=False, error="x")
    s.decide([{"type": "llm.call"}])
    assert s.enqueued_work("llm") == ["llm-2"] and "turn.completed" not in s.types()


def test_llm_outcome_that_is_not_an_object_is_llm_failed():
    s = Sim()
    s.start("hello")
    s.finish_llm(value="just text")
    assert s.ev("llm.failed")["error"].startswith("invalid model response: ")
    assert list(s.state.messages) == ["msg-1"]


# ---- turns and the active head ---------------------------------------------------------------------


def test_turn_completed_waits_for_every_pending_call():
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide()
    s.decide()
    s.finish_tool(calls[0])
    s.decide()
    assert s.of("turn.completed") == []
    s.finish_tool(calls[1])
    s.decide()  # llm.call
    s.finish_llm(content="done")
    assert s.of("turn.completed") == []
    s.decide(expect="llm.completed")
    assert [e["head"] for e in s.of("turn.completed")] == ["msg-5"]


def test_active_head_follows_engine_messages_on_the_active_line():
    s = Sim()
    s.start("hello")
    assert s.head == "msg-1"
    [call] = s.reply_tools("search")
    assert s.head == "msg-2"
    s.decide()
    s.finish_tool(call)
    assert s.head == "msg-3"
    s.decide()
    s.finish_llm(content="done")
    assert s.head == "msg-4" and s.show()["head"] == "msg-4"


def test_active_head_stays_when_the_client_is_elsewhere():
    s = Sim()
    s.start("a")  # llm-1 on msg-1
    s.start("b", parent=None)  # msg-2, llm-2; the client is on msg-2
    s.finish_llm("llm-1", content="reply to a")
    assert s.ev("message.created")["message"]["parent_id"] == "msg-1"
    assert s.head == "msg-2"
    s.decide(expect="llm.completed")
    assert s.ev("turn.completed")["head"] == "msg-3"
    # switching into the middle of a line: engine messages at the tip do not move the head
    s.finish_llm("llm-2", tool_calls=["search"])
    assert s.head == "msg-4"
    s.switch("msg-2")
    s.decide()
    s.finish_tool("call-1")
    assert s.head == "msg-2"


# ---- decide_on / no decide --------------------------------------------------------------------------


def test_decide_on_skips_decide_jobs_for_other_triggers():
    s = Sim(make_app(decide_on={"tool.execute"}))
    s.send("hello")
    # session.created and message.created take proposed at once: the LLM starts in this transition
    assert s.types() == ["session.created", "message.created", "llm.started"]
    assert s.enqueued_work("decide") == [] and s.enqueued_work("llm") == ["llm-1"]
    assert s.deciding is None
    s.finish_llm(tool_calls=["search"])
    assert s.enqueued_work("decide") == ["dec-1"] and s.trigger["type"] == "tool.execute"
    s.decide()
    s.finish_tool("call-1")
    assert s.enqueued_work("decide") == [] and s.enqueued_work("llm") == ["llm-2"]
    s.finish_llm(content="done")
    assert s.types() == ["message.created", "llm.completed", "turn.completed"]


def test_app_without_decide_takes_proposed_everywhere():
    s = Sim(make_app(has_decide=False))
    s.send("hello")
    s.finish_llm(tool_calls=["search", "approval"])
    assert s.types() == ["message.created", "llm.completed", "tool.started", "tool.deferred"]
    assert s.enqueued_work() == ["call-1"]


# ---- stale and late outcomes ---------------------------------------------------------------------


def test_decide_outcome_for_another_job_or_attempt_is_dropped():
    s = Sim()
    s.send("hello")
    d = s.deciding
    before = s.state.core
    tr = s.outcome("decide", d.work, d.attempt + 1, value={"actions": []})
    assert tr.dropped == "stale_decision" and tr.events == [] and tr.effects == []
    assert s.state.core == before
    tr = s.outcome("decide", "dec-99", 1, value={"actions": []})
    assert tr.dropped == "stale_decision" and s.state.core == before
    s.decide()
    tr = s.outcome("decide", d.work, d.attempt, value={"actions": []})  # the same job again
    assert tr.dropped == "stale_decision" and tr.events == []


def test_llm_outcome_with_wrong_attempt_is_dropped():
    s = Sim()
    s.start("hello")
    tr = s.finish_llm("llm-1", content="x", attempt=2)
    assert tr.dropped == "stale_attempt" and tr.events == [] and tr.new_messages == []
    assert s.running_llm() == ["llm-1"]


def test_llm_outcome_twice_is_recorded_once():
    s = Sim()
    s.start("hello")
    s.finish_llm("llm-1", content="x")
    tr = s.finish_llm("llm-1", content="x", attempt=1)
    assert tr.dropped == "already_settled" and tr.events == [] and tr.new_messages == []
    assert tr.counts == {("result_dropped", "already_settled"): 1}


def test_tool_outcome_after_the_call_was_settled_is_dropped():
    s = Sim()
    s.start("hello")
    calls = s.reply_tools("search", "search")
    s.decide()  # call-1 runs
    s.decide([{"type": "tool.result", "call_id": calls[0], "result": "by hand"}])
    tr = s.finish_tool(calls[0], result="late", attempt=1)
    assert tr.dropped == "already_settled" and tr.new_messages == []
    # call-2's own tool.execute decision neither ran nor settled it: settled `not_executed`
    assert [m["content"] for m in s.state.messages.values() if m["role"] == "tool"] == [
        "by hand", "not_executed"]


def test_tool_outcome_for_a_call_not_running_is_dropped():
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools("search")  # status new: its tool.execute is being decided
    tr = s.finish_tool(call, attempt=0)
    assert tr.dropped == "stale_attempt" and tr.events == []
    s.decide()
    tr = s.outcome("llm", call, 1, value={"content": "x"})  # wrong kind
    assert tr.dropped == "stale_attempt" and tr.events == []


def test_outcome_for_missing_session_is_dropped():
    s = Sim()
    tr = s.outcome("tool", "call-1", 1, value=1)
    assert tr.dropped == "no_session" and tr.events == [] and tr.state.core is None


# ---- deferred tools --------------------------------------------------------------------------------


def _deferred() -> tuple[Sim, str]:
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools({"name": "approval", "arguments": {"amount": 5}})
    s.decide()
    return s, call


def test_deferred_tool_runs_nowhere_and_waits_for_tool_result():
    s, call = _deferred()
    assert s.types() == ["tool.deferred"]
    assert s.ev("tool.deferred") | {"at": 0} == {"type": "tool.deferred", "at": 0, "call_id": call,
                                                 "name": "approval", "arguments": {"amount": 5}}
    assert s.enqueued() == []
    assert s.show()["pending"] == [{"call_id": call, "kind": "tool", "name": "approval"}]
    assert s.show()["parked"] is False
    s.send("more")
    assert s.ev("input.refused")["code"] == "turn_in_progress"  # only that call waits
    s.tool_result(call, result={"approved": True})
    assert s.types() == ["message.created", "tool.completed"]
    assert s.ev("message.created")["message"]["content"] == '{"approved":true}'
    assert s.trigger["type"] == "tool.completed" and s.trigger["result"] == {"approved": True}
    assert s.proposed == [{"type": "llm.call"}]


def test_deferred_tool_result_with_error():
    s, call = _deferred()
    s.tool_result(call, error="rejected")
    assert s.ev("tool.completed")["error"] == "rejected"
    assert s.ev("message.created")["message"]["error"] is True


def test_tool_result_for_a_settled_call_is_ignored_already_settled():
    s, call = _deferred()
    s.tool_result(call, result=1)
    tr = s.tool_result(call, result=2, entry_id="4-4")
    assert s.types() == ["input.ignored"]
    assert s.ev("input.ignored")["code"] == "already_settled"
    assert s.ev("input.ignored")["input"] == {"entry": "4-4", "type": "tool.result", "call_id": call}
    assert tr.new_messages == []


def test_tool_result_for_an_unknown_call_is_ignored_unknown_call():
    s, _ = _deferred()
    s.tool_result("call-99", result=1)
    assert s.ev("input.ignored")["code"] == "unknown_call"
    s.tool_result("whatever", result=1)
    assert s.ev("input.ignored")["code"] == "unknown_call"


def test_tool_result_on_missing_session_is_unknown_call():
    s = Sim()
    tr = s.tool_result("call-1", result=1)
    assert s.ev("input.ignored")["code"] == "unknown_call" and tr.state.core is None


def test_tool_result_input_does_not_settle_a_call_that_is_not_deferred():
    s = Sim()
    s.start("hello")
    [call] = s.reply_tools("search")
    s.decide()
    tr = s.tool_result(call, result="forged")
    assert s.types() == ["input.ignored"] and tr.new_messages == []
    assert s.work(call).status == "running"


def test_worker_outcome_for_a_deferred_call_is_dropped():
    s, call = _deferred()
    tr = s.finish_tool(call, result="x", attempt=0)
    assert tr.dropped is not None and tr.events == []
    assert s.work(call).status == "deferred"


# ---- ids and show ----------------------------------------------------------------------------------


def test_ids_are_sequential_per_session():
    s = Sim()
    s.start("a")
    calls = s.reply_tools("search", "search")
    assert calls == ["call-1", "call-2"]
    s.decide()
    s.decide()
    s.finish_tool("call-1")
    s.decide()
    s.finish_tool("call-2")
    s.decide()
    assert s.running_llm() == ["llm-2"]
    assert sorted(s.state.messages) == ["msg-1", "msg-2", "msg-3", "msg-4"]
    other = Sim(session="s2")
    other.start("b")
    assert other.head == "msg-1" and other.running_llm() == ["llm-1"]


def test_show_lists_messages_in_order_without_internal_fields():
    s = Sim()
    s.start("hello")
    s.reply_tools("search")
    view = s.show()
    assert [m["id"] for m in view["messages"]] == ["msg-1", "msg-2"]
    assert all("turn" not in m for m in view["messages"])
    assert view["pending"] == [{"call_id": "call-1", "kind": "tool", "name": "search"}]


def test_show_lists_messages_in_creation_order_whatever_their_ids():
    """docs/protocol.md, Reading a session: messages used to be sorted by the N of `msg-N`, ids
    a producer chose last, so a chosen root came after the replies under it."""
    app = AppInfo()  # no decide: proposed actions apply at once
    s = Sim(app=app)
    s.send("first", message_id="zz-root")
    s.finish_llm(content="reply one")
    s.send("second", message_id="aa-next")
    s.finish_llm(content="reply two")
    s.send("a new root", parent=None)
    order = [m["id"] for m in s.show()["messages"]]
    assert order == ["zz-root", "msg-1", "aa-next", "msg-2", "msg-3"]
    assert all(set(m) <= {"id", "parent_id", "role", "content", "tool_calls", "tool_call_id", "error"}
               for m in s.show()["messages"])
    text = format_transcript(s.show())
    # the text walks the tree from its roots, in the same order (`*` marks the head)
    assert [line[1:].split()[0] for line in text.splitlines()[1:6]] == [
        "zz-root", "msg-1", "aa-next", "msg-2", "msg-3"]


def test_show_puts_parents_first_for_messages_stored_without_their_creation_order():
    """Messages stored before sessions kept their creation order (no `order` field): a parent
    still comes before its children."""
    s = Sim(app=AppInfo())
    s.send("first", message_id="zz-root")
    s.finish_llm(content="reply")
    for m in s.state.messages.values():
        m.pop("order", None)
    assert [m["id"] for m in s.show()["messages"]] == ["zz-root", "msg-1"]


def test_a_decide_that_raised_is_told_with_the_apps_exception_on_the_event_and_the_call():
    """Issue 32: `parley show` used to say only `[call-1 error] decision_failed`."""
    from parley.cli.transcript import format_transcript
    from parley.schemas.results import AppException
    from parley.schemas.view import show

    s = _to_tool_execute()
    d = s.deciding
    assert d is not None
    raised = AppException(type="KeyError", message="'amount'", frames=["myapp.py:12 in decide"])
    s.outcome("decide", d.work, d.attempt, ok=False, error="KeyError: 'amount'", exception=raised)
    assert s.ev("decision.failed")["exception"] == raised.model_dump()
    completed = s.ev("tool.completed")
    assert completed["error"] == "decision_failed" and completed["exception"] == raised.model_dump()
    [message] = [m for m in s.state.messages.values() if m.get("role") == "tool"]
    assert message["content"] == "decision_failed" and message["exception"] == raised.model_dump()
    shown = format_transcript(show(s.state))
    assert "decision_failed  (KeyError: 'amount' at myapp.py:12 in decide)" in shown
    # without one (a timeout, an invalid decision) the fields are absent, not null
    s2 = _to_tool_execute()
    s2.decide(value="done")
    assert "exception" not in s2.ev("decision.failed") and "exception" not in s2.ev("tool.completed")
