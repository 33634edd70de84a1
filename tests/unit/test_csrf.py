"""CSRF tokens (parley/web/csrf.py): fresh and unguessable, and compared so that anything but
the session's own token, including nothing, is refused."""

import string

import pytest

from parley.web import csrf


def test_each_token_is_new_long_and_url_safe() -> None:
    tokens = {csrf.new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert len(token) >= 43  # 32 random bytes
        assert set(token) <= set(string.ascii_letters + string.digits + "-_")


def test_the_sessions_token_matches_itself_only() -> None:
    token = csrf.new_token()
    assert csrf.matches(token, token)
    assert csrf.matches(token, str(token))  # an equal string, not the same object
    assert not csrf.matches(token, csrf.new_token())
    assert not csrf.matches(token, token[:-1])
    assert not csrf.matches(token, token + "x")
    assert not csrf.matches(token, token.upper())


@pytest.mark.parametrize(("expected", "given"), [
    (None, None), ("", ""), (None, "abc"), ("", "abc"), ("abc", None), ("abc", ""),
])
def test_a_missing_token_on_either_side_never_matches(expected: str | None, given: str | None) -> None:
    assert not csrf.matches(expected, given)


def test_a_forged_field_with_any_characters_is_a_mismatch_not_an_error() -> None:
    token = csrf.new_token()
    # hmac.compare_digest raises TypeError on non-ASCII str: that would be a 500, not a 403
    assert not csrf.matches(token, "é" * 43)
    assert not csrf.matches(token, "\x00" * 43)
    assert csrf.matches("jeton-é", "jeton-é")


def test_the_field_is_named_csrf() -> None:
    assert csrf.FIELD == "csrf"
