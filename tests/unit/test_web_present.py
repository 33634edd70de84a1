"""The inbox's pure wording and reading: outcomes, durations, the conversation's path, the
list's query string."""

import pytest

from parley.schemas.resumes import ResumeOutcome, ResumeStatus
from parley.web.conversation import path_to
from parley.web.present import AnswerStatus, answer_result, countdown, duration
from parley.web.query import ListQuery, Order, QueryError


def outcome(status: ResumeStatus, code: str | None = None, **kw: object) -> ResumeOutcome:
    return ResumeOutcome(status=status, entry="1-0", code=code, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "shown"), [
    (outcome(ResumeStatus.DELIVERED), AnswerStatus.DELIVERED),
    (outcome(ResumeStatus.NOT_DELIVERED, message="other branch"), AnswerStatus.NOT_DELIVERED),
    (outcome(ResumeStatus.REFUSED, "forbidden", message="not yours"), AnswerStatus.REFUSED),
    (outcome(ResumeStatus.IGNORED, "already_resumed"), AnswerStatus.ALREADY_ANSWERED),
    (outcome(ResumeStatus.IGNORED, "session_closed"), AnswerStatus.IGNORED),
    (outcome(ResumeStatus.TIMEOUT, message="no dispatcher"), AnswerStatus.TIMEOUT),
])
def test_each_engine_outcome_has_its_own_status(given: ResumeOutcome, shown: AnswerStatus) -> None:
    assert answer_result(given).status is shown


def test_a_refusal_keeps_the_engines_reason_and_path() -> None:
    result = answer_result(outcome(ResumeStatus.REFUSED, "invalid_resume", message="101 > 100",
                                   path="$.amount"))
    assert (result.code, result.detail, result.path) == ("invalid_resume", "101 > 100", "$.amount")
    assert "still open" in result.headline


def test_a_session_closed_says_so() -> None:
    assert "closed" in (answer_result(outcome(ResumeStatus.IGNORED, "session_closed")).detail or "")


@pytest.mark.parametrize(("ms", "text"), [(0, "0s"), (-5, "0s"), (42_999, "42s"), (65_000, "1m 05s"),
                                          (2 * 3600_000 + 7 * 60_000, "2h 07m"), (76 * 3600_000, "3d 4h")])
def test_durations_read_as_a_person_says_them(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_a_countdown_says_passed_once_the_deadline_is_behind() -> None:
    assert countdown(1_000, 2_000) == "passed"
    assert countdown(62_000, 2_000) == "in 1m 00s"


MESSAGES = [
    {"id": "m1", "parent_id": None, "role": "user", "content": "email bob: hi"},
    {"id": "m2", "parent_id": "m1", "role": "assistant", "content": "",
     "tool_calls": [{"id": "c1", "name": "send_email", "arguments": {"to": "bob"}}]},
    {"id": "m3", "parent_id": "m1", "role": "assistant", "content": "another branch"},
    {"id": "m4", "parent_id": "m2", "role": "tool", "content": "sent", "tool_call_id": "c1"},
]


def test_the_path_runs_from_the_root_to_the_anchor_and_skips_other_branches() -> None:
    shown = path_to(MESSAGES, "m4")
    assert [m.message_id for m in shown.messages] == ["m1", "m2", "m4"]
    assert shown.messages[1].tool_calls[0].name == "send_email"
    assert '"to": "bob"' in shown.messages[1].tool_calls[0].arguments
    assert shown.messages[2].answers_call == "c1"


def test_a_long_path_shows_the_messages_nearest_the_question() -> None:
    chain = [{"id": f"m{i}", "parent_id": f"m{i - 1}" if i else None, "role": "user", "content": str(i)}
             for i in range(10)]
    shown = path_to(chain, "m9", max_shown=3)
    assert [m.message_id for m in shown.messages] == ["m7", "m8", "m9"]
    assert shown.earlier == 7


def test_a_damaged_tree_ends_the_walk_instead_of_looping() -> None:
    looped = [{"id": "a", "parent_id": "b", "role": "user", "content": ""},
              {"id": "b", "parent_id": "a", "role": "user", "content": ""}]
    assert len(path_to(looped, "a").messages) == 2
    assert path_to(MESSAGES, "missing").messages == ()
    assert path_to(MESSAGES, None).messages == ()


def test_the_query_string_round_trips_and_drops_defaults() -> None:
    q = ListQuery.parse({"order": "newest", "reason": "confirm", "session": "acme/", "mine": "1"})
    assert (q.order, q.reason, q.session_prefix, q.mine) == (Order.NEWEST, "confirm", "acme/", True)
    assert ListQuery.parse(dict(p.split("=") for p in q.query_string("CUR")[1:].split("&"))).cursor == "CUR"
    assert ListQuery().query_string() == ""
    flt = q.interrupt_filter("alice")
    assert (flt.principal, flt.newest_first, flt.reason) == ("alice", True, "confirm")
    assert ListQuery.parse({}).interrupt_filter("alice").principal is None
    searched = ListQuery.parse({"q": "  Müller  ", "reason": "confirm"})
    assert searched.search == "Müller" and searched.filtered and not ListQuery().filtered
    assert searched.interrupt_filter("alice").text == "Müller"
    assert ListQuery.parse({"q": "   "}).search is None
    assert "q=M%C3%BCller" in searched.query_string()


@pytest.mark.parametrize("params", [{"order": "sideways"}, {"reason": "x" * 257}, {"session": "s" * 300},
                                    {"q": "w" * 257}])
def test_a_bad_query_is_refused_naming_the_parameter(params: dict[str, str]) -> None:
    with pytest.raises(QueryError, match=next(iter(params)) if "order" not in params else "order"):
        ListQuery.parse(params)


def test_an_answer_too_late_says_who_or_what_answered_first() -> None:
    from parley.web.present import no_longer_open

    resumed = {"type": "interrupt.resumed", "interrupt_id": "int-1", "principal": "bob"}
    assert "by bob" in no_longer_open(resumed, "alice").headline
    assert "You have already answered" in no_longer_open(resumed, "bob").headline
    assert "deadline" in no_longer_open({**resumed, "timed_out": True, "principal": None}, "bob").headline
    cancelled = no_longer_open({"type": "interrupt.cancelled", "interrupt_id": "int-1"}, "bob")
    assert cancelled.status is AnswerStatus.IGNORED and "closed" in cancelled.headline
    assert no_longer_open(None, "bob").status is AnswerStatus.ALREADY_ANSWERED


def test_a_sign_in_holds_only_for_its_principal_and_the_credential_it_used() -> None:
    from parley.web.signins import SignIn, fingerprint

    signin = SignIn.from_json(SignIn("alice", fingerprint("scrypt$old")).to_json())
    assert signin is not None and signin.holds("alice", {"alice": "scrypt$old"})
    assert not signin.holds("alice", {"alice": "scrypt$new"})  # a new password
    assert not signin.holds("alice", {})  # removed from the users file
    assert not signin.holds("bob", {"alice": "scrypt$old", "bob": "scrypt$old"})
    assert SignIn.from_json(b"not json") is None and SignIn.from_json(None) is None


def test_password_guessing_is_slowed_per_principal_and_per_address() -> None:
    from parley.web.throttle import Throttle

    throttle = Throttle(free=3, window_s=60, base_s=2, cap_s=10)
    keys = ["principal:alice", "address:10.0.0.1"]
    for n in range(3):
        assert throttle.wait_s(keys, 100 + n) == 0
        throttle.failed(keys, 100 + n)
    assert throttle.wait_s(keys, 102.5) == 1.5  # locked 2 s after the third failure
    assert throttle.wait_s(["address:10.0.0.1"], 102.5) == 1.5  # the same address, another name
    assert throttle.wait_s(["principal:bob", "address:10.0.0.2"], 102.5) == 0
    throttle.failed(keys, 105)
    assert throttle.wait_s(keys, 105) == 4  # doubles
    for n in range(10):
        throttle.failed(keys, 106 + n)
    assert throttle.wait_s(keys, 115) == 10  # capped
    throttle.succeeded("principal:alice")
    assert throttle.wait_s(["principal:alice"], 115) == 0
    assert throttle.wait_s(keys, 200) == 0  # the window has passed


def test_the_throttle_table_stays_bounded() -> None:
    from parley.web.throttle import Throttle

    throttle = Throttle(max_tracked=100)
    for n in range(1_000):
        throttle.failed([f"address:{n}"], 0)
    assert len(throttle._failures) == 100
