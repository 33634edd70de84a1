"""Input stream entries (schemas.codec; docs/protocol.md, Writing inputs, Ids and limits, Inputs,
Order of checks) and decisions (schemas.actions; docs/protocol.md, Actions)."""

import orjson
import pytest
from pydantic import ValidationError

from parley.schemas.actions import (
    Decision,
    InterruptAction,
    LlmCall,
    MessageAction,
    ToolExecute,
    ToolResult,
    decision_from_app,
)
from parley.schemas.codec import (
    DEFAULT_MAX_INPUT_BYTES,
    MAX_DEPTH,
    InputError,
    decode_input_entry,
    max_input_bytes,
    session_of,
)
from parley.schemas.codes import RefusalCode
from parley.schemas.inputs import BranchSwitch, InterruptResume, MessageCreate, SessionCreate, ToolResultInput


def entry(value, session=b"s-42", **extra):
    fields = {b"input": value if isinstance(value, bytes) else orjson.dumps(value)}
    if session is not None:
        fields[b"session"] = session
    fields.update({k.encode(): v for k, v in extra.items()})
    return fields


# ---- valid entries --------------------------------------------------------------------------------


def test_decode_session_create():
    e = decode_input_entry(entry({"type": "session.create", "budget": {"llm_calls": 5},
                                  "metadata": {"k": [1]}}))
    assert e.session == "s-42" and e.idempotency_key is None and e.principal is None
    assert isinstance(e.input, SessionCreate)
    assert e.input.budget is not None and e.input.budget.llm_calls == 5
    assert e.input.budget.tokens is None and e.input.metadata == {"k": [1]}


def test_decode_message_create_parent_omitted_null_and_given():
    omitted = decode_input_entry(entry({"type": "message.create", "content": "hi"})).input
    null = decode_input_entry(entry({"type": "message.create", "content": "hi", "parent_id": None})).input
    given = decode_input_entry(entry({"type": "message.create", "content": "hi", "parent_id": "msg-3",
                                      "message_id": "m.1"})).input
    assert isinstance(omitted, MessageCreate) and isinstance(null, MessageCreate)
    assert isinstance(given, MessageCreate)
    assert omitted.parent_given is False and omitted.parent_id is None
    assert null.parent_given is True and null.parent_id is None
    assert given.parent_given is True and given.parent_id == "msg-3" and given.message_id == "m.1"


def test_decode_interrupt_resume_branch_switch_and_tool_result():
    r = decode_input_entry(entry({"type": "interrupt.resume", "interrupt_id": "int-1",
                                  "payload": {"approved": True}})).input
    assert isinstance(r, InterruptResume) and r.payload == {"approved": True}
    b = decode_input_entry(entry({"type": "branch.switch", "head": "msg-2"})).input
    assert isinstance(b, BranchSwitch) and b.head == "msg-2"
    t = decode_input_entry(entry({"type": "tool.result", "call_id": "call-1", "result": None})).input
    assert isinstance(t, ToolResultInput) and t.result is None and "result" in t.model_fields_set
    t = decode_input_entry(entry({"type": "tool.result", "call_id": "call-1", "error": "no"})).input
    assert isinstance(t, ToolResultInput) and t.error == "no"


def test_decode_keeps_idempotency_key_but_never_trusts_a_claimed_principal():
    e = decode_input_entry(entry({"type": "session.create"}, id=b"key-1", principal=b"alice"))
    assert e.idempotency_key == "key-1" and e.principal is None  # set only after verification


def test_decode_accepts_str_field_names_and_values():
    e = decode_input_entry({"session": "s1", "input": '{"type":"branch.switch","head":"m"}', "id": "k"})
    assert e.session == "s1" and isinstance(e.input, BranchSwitch) and e.idempotency_key == "k"


def test_session_id_of_128_chars_is_valid_and_129_is_not():
    assert decode_input_entry(entry({"type": "session.create"}, session=b"a" * 128)).session == "a" * 128
    with pytest.raises(InputError):
        decode_input_entry(entry({"type": "session.create"}, session=b"a" * 129))


def test_input_exactly_at_the_limit_is_accepted():
    value = {"type": "message.create", "content": ""}
    raw = orjson.dumps(value)
    value["content"] = "x" * (100 - len(raw))
    assert len(orjson.dumps(value)) == 100
    assert isinstance(decode_input_entry(entry(value), limit=100).input, MessageCreate)


def test_default_limit_is_1_mib_and_configurable(monkeypatch):
    monkeypatch.delenv("PARLEY_MAX_INPUT_BYTES", raising=False)
    assert max_input_bytes() == DEFAULT_MAX_INPUT_BYTES == 1024 * 1024
    monkeypatch.setenv("PARLEY_MAX_INPUT_BYTES", "50")
    with pytest.raises(InputError, match="over the limit of 50"):
        decode_input_entry(entry({"type": "message.create", "content": "x" * 60}))


def test_an_input_over_the_limit_is_refused_too_large_and_any_other_bad_one_invalid_input():
    over = refused(entry({"type": "message.create", "content": "x" * 200}, id="k-1"), limit=100)
    assert over.code == RefusalCode.TOO_LARGE == "too_large"
    assert "bytes, over the limit of 100" in str(over)
    assert over.idempotency_key == "k-1"  # used up, as for any entry that reaches its session
    assert refused(entry({"type": "nope"})).code == RefusalCode.INVALID_INPUT


# ---- bad entries ----------------------------------------------------------------------------------


def refused(fields, **kw) -> InputError:
    with pytest.raises(InputError) as info:
        decode_input_entry(fields, **kw)
    return info.value


def test_entry_without_session_is_refused():
    err = refused(entry({"type": "session.create"}, session=None))
    assert "no `session`" in str(err) and err.input_type is None
    assert session_of(entry({"type": "session.create"}, session=None)) is None


@pytest.mark.parametrize("session", [b"", b"has space", b"{braces}", "é".encode(), b"ten{ant}/s",
                                     # a tenant is 1-64 of [A-Za-z0-9._-] and names a session
                                     b"/s-1", b"a:b/s-1", b"acme/", b"a*/s-1", b"a[b]/s-1",
                                     b"t" * 65 + b"/s-1"])
def test_entry_with_bad_session_id_is_refused(session):
    err = refused(entry({"type": "session.create"}, session=session))
    assert "`session`" in str(err)
    assert session_of(entry({"type": "session.create"}, session=session)) is None


def test_session_of_reports_a_valid_session_of_a_bad_entry():
    assert session_of(entry(b"not json", session=b"s-1")) == "s-1"


def test_entry_without_input_is_refused():
    err = refused({b"session": b"s1"})
    assert "no `input`" in str(err)


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"type": "session.create"', b"\xff\xfe"])
def test_invalid_json_is_refused_with_no_type(raw):
    err = refused(entry(raw))
    assert "not valid JSON" in str(err)
    assert err.input_type is None and err.ids == {}


@pytest.mark.parametrize("value", [[1, 2], "text", 3, None, True])
def test_non_object_input_is_refused(value):
    err = refused(entry(value))
    assert "must be a JSON object" in str(err)


def test_unknown_type_is_refused_with_its_type_and_ids():
    err = refused(entry({"type": "message.delete", "message_id": "msg-1", "head": 5}))
    assert "unknown input type 'message.delete'" in str(err)
    assert err.input_type == "message.delete"
    assert err.ids == {"message_id": "msg-1"}  # only string ids are reported


def test_a_misspelt_type_is_refused_with_a_did_you_mean_and_the_types():
    err = refused(entry({"type": "interrupt.resumed", "interrupt_id": "int-1"}))
    assert "unknown input type 'interrupt.resumed' (did you mean 'interrupt.resume'?)" in str(err)
    assert "; the types are branch.switch, interrupt.resume, message.create" in str(err)
    far = refused(entry({"type": "zzz"}))
    assert "did you mean" not in str(far)


def test_missing_type_is_refused():
    err = refused(entry({"content": "hi"}))
    assert "unknown input type None" in str(err) and err.input_type is None


def test_non_string_type_is_refused_without_type():
    err = refused(entry({"type": 5, "call_id": "call-1"}))
    assert "unknown input type 5" in str(err)
    assert err.input_type is None and err.ids == {"call_id": "call-1"}


@pytest.mark.parametrize(("value", "field"), [
    ({"type": "message.create"}, "content"),
    ({"type": "message.create", "content": 5}, "content"),
    ({"type": "interrupt.resume"}, "interrupt_id"),
    ({"type": "branch.switch"}, "head"),
    ({"type": "tool.result", "result": 1}, "call_id"),
    ({"type": "message.create", "content": "x", "parent_id": "bad id"}, "parent_id"),
    ({"type": "message.create", "content": "x", "message_id": "m" * 129}, "message_id"),
    ({"type": "message.create", "content": "x", "extra": 1}, "extra"),
    ({"type": "session.create", "budget": {"llm_calls": -1}}, "budget.llm_calls"),
    ({"type": "session.create", "budget": {"dollars": 1}}, "budget.dollars"),
])
def test_missing_or_invalid_fields_are_refused_naming_the_field(value, field):
    err = refused(entry(value))
    assert str(err).startswith(f"invalid {value['type']}: ")
    assert field in str(err)
    assert err.input_type == value["type"]


def test_invalid_input_still_reports_its_ids():
    err = refused(entry({"type": "interrupt.resume", "interrupt_id": "int-1", "payload": 1, "x": 2}))
    assert err.ids == {"interrupt_id": "int-1"} and err.input_type == "interrupt.resume"


@pytest.mark.parametrize("value", [
    {"type": "tool.result", "call_id": "call-1"},
    {"type": "tool.result", "call_id": "call-1", "result": 1, "error": "x"},
])
def test_tool_result_needs_exactly_one_of_result_and_error(value):
    err = refused(entry(value))
    assert "exactly one of `result` and `error`" in str(err)


def test_input_over_the_size_limit_is_refused():
    value = {"type": "message.create", "content": "x" * 200}
    err = refused(entry(value), limit=100)
    assert "over the limit of 100" in str(err)
    assert err.input_type is None  # checked before parsing


def test_input_nested_too_deep_is_refused():
    deep: object = "leaf"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    err = refused(entry({"type": "interrupt.resume", "interrupt_id": "int-1", "payload": deep}))
    assert f"nested deeper than {MAX_DEPTH}" in str(err)
    assert err.input_type == "interrupt.resume" and err.ids == {"interrupt_id": "int-1"}


def test_input_nested_just_within_the_limit_is_accepted():
    deep: object = 1
    for _ in range(MAX_DEPTH - 2):  # the object is level 1, payload's list level 2, ...
        deep = [deep]
    e = decode_input_entry(entry({"type": "interrupt.resume", "interrupt_id": "i", "payload": deep}))
    assert isinstance(e.input, InterruptResume)


@pytest.mark.parametrize("key", [b"", b"k" * 257])
def test_bad_idempotency_key_is_refused(key):
    err = refused(entry({"type": "session.create"}, id=key))
    assert "`id` must be 1-256 characters" in str(err)


@pytest.mark.parametrize("key", [b"key-\xff", b"key-\xfe", b"\xc3"])
def test_idempotency_key_that_is_not_utf8_is_refused(key):
    """Two keys that differ only in bytes that are not UTF-8 must not merge into one
    (`key-\ufffd`): such a key is refused, naming the problem, and marks nothing used."""
    err = refused(entry({"type": "session.create"}, id=key))
    assert "`id` is not valid UTF-8" in str(err)
    assert err.idempotency_key is None


def test_a_refused_entry_carries_the_valid_key_it_uses_up():
    err = refused(entry(b"{bad json", id=b"k-\xc3\xa9"))
    assert err.idempotency_key == "k-\u00e9"
    assert refused(entry({"type": "session.create"}, id=b"")).idempotency_key is None


def test_session_that_is_not_utf8_is_refused_saying_so():
    err = refused(entry({"type": "session.create"}, session=b"s-\xff"))
    assert "`session` is not valid UTF-8" in str(err)
    assert session_of(entry({"type": "session.create"}, session=b"s-\xff")) is None


# ---- numbers: integers beyond 64 bits are refused, never rounded to floats ------------------------


@pytest.mark.parametrize("raw, path", [
    (b'{"type": "session.create", "metadata": {"n": 18446744073709551616}}', "metadata.n"),
    (b'{"type": "session.create", "metadata": {"l": [1, -9223372036854775809]}}', "metadata.l[1]"),
    (b'{"type": "interrupt.resume", "interrupt_id": "int-1", "payload": 123456789012345678901234567890}',
     "payload"),
])
def test_integer_beyond_64_bits_is_refused_naming_its_path(raw, path):
    err = refused(entry(raw))
    assert f"integer beyond 64 bits at {path}" in str(err)
    assert err.input_type == orjson.loads(raw)["type"]


def test_integers_within_64_bits_and_large_floats_stay_exact():
    raw = (b'{"type": "session.create", "metadata": {"max": 18446744073709551615, '
           b'"min": -9223372036854775808, "f": 1.8446744073709552e19, "e": 1e300}}')
    e = decode_input_entry(entry(raw))
    assert isinstance(e.input, SessionCreate)
    assert e.input.metadata == {"max": 2**64 - 1, "min": -(2**63), "f": 1.8446744073709552e19, "e": 1e300}
    assert isinstance(e.input.metadata["max"], int) and isinstance(e.input.metadata["f"], float)


# ---- decisions ------------------------------------------------------------------------------------


def test_decision_from_dict_list_and_decision():
    d = decision_from_app({"actions": [{"type": "llm.call"}, {"type": "message", "content": "x"}]})
    assert [type(a) for a in d.actions] == [LlmCall, MessageAction]
    assert decision_from_app([{"type": "tool.result", "result": {"a": 1}}]).actions == [
        ToolResult(result={"a": 1})]
    same = Decision(actions=[LlmCall()])
    assert decision_from_app(same) is same
    assert decision_from_app({}).actions == []


def test_decision_from_actions_given_as_models():
    d = decision_from_app({"actions": [ToolExecute(name="search", arguments={"q": 1}),
                                       InterruptAction(reason="why")]})
    assert d.actions[0] == ToolExecute(name="search", arguments={"q": 1})
    assert isinstance(d.actions[1], InterruptAction) and d.actions[1].reason == "why"


def test_decision_none_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="return `proposed` to carry on"):
        decision_from_app(None)


@pytest.mark.parametrize("value", [
    {"actions": [{"type": "interrupt"}]},  # reason is required
    {"actions": [{"type": "interrupt", "reason": ""}]},
    {"actions": [{"type": "interrupt", "reason": "r" * 257}]},
    {"actions": [{"type": "interrupt", "reason": "r", "timeout_s": 0}]},
    {"actions": [{"type": "interrupt", "reason": "r", "interrupt_id": "bad id"}]},
    {"actions": [{"type": "tool.error"}]},
    {"actions": [{"type": "tool.result"}]},  # result is required (null is fine)
    {"actions": [{"type": "message"}]},
    {"actions": [{"type": "tool.execute", "name": "has space"}]},
    {"actions": [{"type": "nope"}]},
    {"actions": [{"content": "no type"}]},
    {"actions": [{"type": "llm.call", "unknown": 1}]},
    {"actions": [], "extra": True},
    {"actions": "llm.call"},
    "proposed",
])
def test_invalid_decisions_are_refused(value):
    with pytest.raises((ValidationError, ValueError)):
        decision_from_app(value)


def test_tool_result_with_null_result_is_valid():
    [a] = decision_from_app([{"type": "tool.result", "result": None}]).actions
    assert isinstance(a, ToolResult) and a.result is None


def test_interrupt_action_fields():
    [a] = decision_from_app([{"type": "interrupt", "reason": "confirm", "payload": {"q": 1},
                              "timeout_s": 30, "default": {"approved": False},
                              "resumable_by": ["alice"], "interrupt_id": "ask-1"}]).actions
    assert isinstance(a, InterruptAction)
    assert (a.reason, a.payload, a.timeout_s, a.default, a.resumable_by, a.interrupt_id) == (
        "confirm", {"q": 1}, 30.0, {"approved": False}, ["alice"], "ask-1")


def test_decision_to_wire_leaves_out_unset_fields():
    d = decision_from_app([{"type": "llm.call"}, {"type": "tool.execute", "call_id": "call-1"},
                           {"type": "tool.result", "result": None}])
    assert d.to_wire() == {"actions": [{"type": "llm.call"},
                                       {"type": "tool.execute", "call_id": "call-1"},
                                       {"type": "tool.result", "result": None}]}
    assert decision_from_app(d.to_wire()) == d
