"""The tree's shape (schemas/tree.py): what the dispatcher keeps of a session's messages in its meta
hash so that a transition never reads the messages hash, and `parley show`'s text of the tree."""

import orjson

from parley.cli.transcript import format_transcript
from parley.dispatcher.core import AppInfo
from parley.schemas.state import Core, SessionState, Turn, bodies_wanted
from parley.schemas.tree import CHUNK, Shape, field

from .harness import Sim, loaded, stored_fields


def chain(n: int, start: int = 1) -> list[dict[str, str | None]]:
    return [{"id": f"m{i}", "parent_id": f"m{i - 1}" if i > 1 else None, "turn": "m1"}
            for i in range(start, start + n)]


def stored(shape: Shape) -> dict[bytes, bytes]:
    return {k.encode(): v for k, v in shape.dirty_fields().items()}


# ---- the stored form ----------------------------------------------------------------------------


def test_a_shape_not_yet_stored_is_written_whole_in_chunks_and_reads_back():
    shape = Shape.from_messages(chain(2 * CHUNK + 5))
    fields = shape.dirty_fields()
    assert sorted(fields) == [field(0), field(1), field(2)]
    assert len(orjson.loads(fields[field(0)])) == 3 * CHUNK and len(orjson.loads(fields[field(2)])) == 3 * 5
    back = Shape.from_fields(stored(shape))
    assert back is not None and back.flat == shape.flat and back.stored == 2 * CHUNK + 5


def test_an_empty_shape_not_yet_stored_still_writes_its_first_chunk():
    """So a session with no message yet is not taken for one stored before the shape was kept."""
    assert Shape(stored=None).dirty_fields() == {field(0): b"[]"}
    assert Shape.from_fields({field(0).encode(): b"[]"}) is not None


def test_a_commit_rewrites_only_the_chunks_its_new_messages_fall_in():
    shape = Shape.from_fields(stored(Shape.from_messages(chain(CHUNK + 3))))
    assert shape is not None
    assert shape.dirty_fields() == {}  # nothing added: nothing written
    shape.add("x", "m3", "m1")
    assert list(shape.dirty_fields()) == [field(1)]
    # across a chunk's end: the old last chunk and the new one
    full = Shape.from_fields(stored(Shape.from_messages(chain(CHUNK - 1))))
    assert full is not None
    full.add("y", f"m{CHUNK - 1}", "m1")
    full.add("z", "y", "m1")
    assert list(full.dirty_fields()) == [field(0), field(1)]


def test_no_shape_in_the_meta_hash_reads_as_none():
    assert Shape.from_fields({b"core": b"{}", b"ver": b"3"}) is None


def test_the_writes_of_a_commit_do_not_grow_with_the_session():
    small = Shape.from_fields(stored(Shape.from_messages(chain(10))))
    big = Shape.from_fields(stored(Shape.from_messages(chain(20 * CHUNK + 10))))
    assert small is not None and big is not None
    small.add("new", "m10", "m1")
    big.add("new", f"m{20 * CHUNK + 10}", "m1")
    grown = sum(map(len, big.dirty_fields().values())) - sum(map(len, small.dirty_fields().values()))
    assert grown < 20 * 20  # only the longer ids of the last chunk, nothing of the 20 chunks before


# ---- queries ------------------------------------------------------------------------------------


def test_queries_of_a_shape_and_of_what_is_added_after_they_were_asked():
    shape = Shape.from_messages([*chain(3), {"id": "f", "parent_id": "m1", "turn": "f"}])
    assert shape.has("m2") and not shape.has("nope")
    assert shape.parent_of("m3") == "m2" and shape.parent_of("m1") is None
    assert shape.turn_of("f") == "f" and shape.turn_of("nope") is None
    assert shape.has_child("m1") and not shape.has_child("m3")
    assert shape.branches() == 2 and len(shape) == 4
    shape.add("m4", "m3", "m1")
    assert shape.has("m4") and shape.parent_of("m4") == "m3" and shape.turn_of("m4") == "m1"
    assert shape.has_child("m3") and shape.branches() == 2


# ---- what a transition reads --------------------------------------------------------------------


def test_a_transition_reads_the_shape_and_no_body():
    """The harness hands the core only the bodies `bodies_wanted` names (none here), as the store
    does: a long turn, a fork and a branch switch all run on the shape alone."""
    s = Sim(app=AppInfo())
    s.start("one")
    s.finish_llm(content="answer")
    assert loaded(s.state).messages == {} and s.state.tree is not None
    s.send("fork", parent="msg-1")
    s.finish_llm(content="other")
    s.switch("msg-2")
    assert s.ev("branch.switched")["head"] == "msg-2"
    assert s.core.n_branches == 2


def test_the_llm_job_names_the_branch_and_carries_no_body():
    s = Sim(app=AppInfo())
    s.start("one")
    s.finish_llm(content="answer")
    s.send("fork", parent="msg-1")
    [job] = s.enqueued("llm")
    assert job.args == {"chain": ["msg-1", "msg-3"], "request": {}}
    assert [m["content"] for m in s.llm_request(job)["messages"]] == ["one", "fork"]


def test_a_session_stored_before_the_shape_was_kept_gets_it_on_its_next_transition():
    s = Sim(app=AppInfo())
    for i in range(CHUNK // 2 + 1):  # more than one chunk of messages
        s.start(f"q{i}")
        s.finish_llm(content=f"a{i}")
    messages = dict(s.state.messages)
    s.state = SessionState(core=s.core, messages=messages)  # as an older commit stored it
    s.switch("msg-1")
    assert s.last is not None
    fields = s.last.tree_fields
    assert sorted(fields) == [field(0), field(1)]  # the whole shape, once
    shape = Shape.from_fields({k.encode(): v for k, v in fields.items()})
    assert shape is not None and shape.ids() == [m["id"] for m in s.show()["messages"]]
    s.switch(f"msg-{len(messages)}")
    assert s.last.tree_fields == {}  # stored now: a transition adding nothing writes nothing of it


def test_the_bodies_a_transition_may_read_are_an_unreported_childs_turn_tips():
    core = Core(session="p:sub-1", created_at=1, parent={"session": "p"},
                turns={"msg-1": Turn(id="msg-1", tip="msg-4")})
    assert bodies_wanted(core) == ["msg-4"]
    assert bodies_wanted(core.model_copy(update={"reported": True})) == []
    assert bodies_wanted(core.model_copy(update={"parent": None})) == []
    assert bodies_wanted(None) == []


def test_stored_fields_helper_matches_a_whole_write():
    flat = Shape.from_messages(chain(5)).flat
    assert stored_fields(flat) == Shape(flat, stored=None).dirty_fields()


# ---- `parley show`'s text -------------------------------------------------------------------------


def view_of(messages: list[dict[str, str | None]], head: str) -> dict[str, object]:
    return {"session": "s", "status": "active", "head": head, "parked": False, "interrupts": [],
            "pending": [], "messages": [{**m, "role": "user", "content": m["id"]} for m in messages]}


def depth_of(line: str) -> int:
    """The indentation step of a transcript line (the id is right-aligned in 7 columns)."""
    rest = line[1:]
    mid = rest.split()[0]
    return (len(rest) - len(rest.lstrip()) - max(0, 7 - len(mid))) // 2


def test_a_long_branch_prints_flush_left_without_recursing():
    text = format_transcript(view_of(chain(5000), "m5000"))
    lines = text.splitlines()[1:]
    assert len(lines) == 5000
    assert {depth_of(line) for line in lines} == {0}  # all at one depth
    assert lines[-1].startswith("*")


def test_a_fork_indents_each_childs_subtree():
    messages = [*chain(2), {"id": "f1", "parent_id": "m1", "turn": "f1"},
                {"id": "f2", "parent_id": "f1", "turn": "f1"}]
    lines = format_transcript(view_of(messages, "f2")).splitlines()[1:]
    assert [line[1:].split()[0] for line in lines] == ["m1", "m2", "f1", "f2"]
    depth = [depth_of(line) for line in lines]
    assert depth == [0, 1, 1, 1]


def test_tool_calls_and_tool_results_print_around_the_content():
    messages = [{"id": "m1", "parent_id": None, "role": "assistant", "content": "let me look",
                 "tool_calls": [{"id": "call-1", "name": "search", "arguments": {"q": 1}}]},
                {"id": "m2", "parent_id": "m1", "role": "tool", "content": "boom", "tool_call_id": "call-1",
                 "error": True},
                {"id": "m3", "parent_id": "m2", "role": "assistant", "content": "",
                 "tool_calls": [{"id": "call-2", "name": "add", "arguments": {}}]}]
    view = {"session": "s", "status": "active", "head": "m3", "parked": False, "interrupts": [],
            "pending": [{"call_id": "call-2", "kind": "tool", "name": "add"}], "messages": messages}
    assert format_transcript(view).splitlines()[1:] == [
        '      m1 assistant let me look search({"q":1}) [call-1]',
        "      m2 tool      [call-1 error] boom",
        "*     m3 assistant add({}) [call-2]",
        "  pending call-2 tool add"]
