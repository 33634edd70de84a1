"""CSRF tokens (pure): one random token per signed-in session, kept in the signed session
cookie and repeated in a hidden field of every form; a POST whose field does not match is
refused (403) before it does anything."""

#: the hidden field's name
FIELD = "csrf"


def new_token() -> str:
    raise NotImplementedError


def matches(expected: str | None, given: str | None) -> bool:
    """Whether a form's token is the session's (constant time; missing on either side: no)."""
    raise NotImplementedError
