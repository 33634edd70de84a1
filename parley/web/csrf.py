"""CSRF tokens (pure): one random token per signed-in session, kept in the signed session
cookie and repeated in a hidden field of every form; a POST whose field does not match is
refused (403) before it does anything."""

import hmac
import secrets

#: the hidden field's name
FIELD = "csrf"


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def matches(expected: str | None, given: str | None) -> bool:
    """Whether a form's token is the session's (constant time; missing on either side: no)."""
    if not expected or not given or not isinstance(expected, str) or not isinstance(given, str):
        return False
    # Compared as UTF-8 bytes: compare_digest refuses a str with non-ASCII characters (a
    # TypeError, a 500 instead of a 403, for a forged field).
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8"))
