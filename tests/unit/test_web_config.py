"""The inbox's cookie and cache choices (parley/web/config.py, parley/web/observe.py)."""

from pathlib import Path

import pytest
from starlette.responses import Response

from parley.web.config import is_loopback, secure_cookies_for


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_addresses_are_this_machine_only(host: str) -> None:
    assert is_loopback(host)
    assert secure_cookies_for(host, None) is False  # plain HTTP to a browser on this machine
    assert secure_cookies_for(host, True) is True  # as chosen


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "inbox.example.com", "127.0.0.1.example.com"])
def test_anywhere_else_the_cookie_is_secure_unless_turned_off(host: str) -> None:
    assert not is_loopback(host)
    assert secure_cookies_for(host, None) is True
    assert secure_cookies_for(host, False) is False


def _pages(tmp_path: Path, secure: bool | None, scheme: str = "https") -> tuple[Response, Response]:
    """The sign-in page and a static file, from an inbox made with `secure` (None: the default),
    asked for over `scheme`."""
    import json

    from starlette.testclient import TestClient

    from parley.web.app import create_app
    from parley.web.config import InboxConfig
    from parley.web.users import hash_password
    (tmp_path / "users.json").write_text(json.dumps({"alice": {"password": hash_password("pw")}}))
    (tmp_path / "keys.json").write_text(json.dumps({"alice": "alice-key-0123456789"}))
    options = {} if secure is None else {"secure_cookies": secure}
    # no Redis is reached: the sign-in form only starts a cookie session for its CSRF token
    config = InboxConfig(redis_urls=("redis://127.0.0.1:1/0",), users_file=str(tmp_path / "users.json"),
                         keys_file=str(tmp_path / "keys.json"), **options)  # type: ignore[arg-type]
    with TestClient(create_app(config), base_url=f"{scheme}://inbox.example") as web:
        return web.get("/signin"), web.get("/static/inbox.css")


def test_the_cookie_is_secure_unless_turned_off_and_no_page_with_data_is_cached(tmp_path: Path) -> None:
    page, static = _pages(tmp_path, None)
    assert page.status_code == 200 and static.status_code == 200
    cookie = page.headers["set-cookie"]
    assert cookie.startswith("parley_inbox=") and "secure" in cookie.lower() and "httponly" in cookie.lower()
    assert page.headers["cache-control"] == "no-store"
    assert static.headers.get("cache-control") != "no-store"  # the same for everyone: cacheable
    assert "content-security-policy" in static.headers
    assert "secure" not in _pages(tmp_path, False, "http")[0].headers["set-cookie"].lower()


def test_over_https_every_cookie_is_secure_whatever_was_chosen(tmp_path: Path) -> None:
    from parley.web.observe import secured
    plain = [(b"set-cookie", b"parley_inbox=x; path=/; httponly; samesite=lax"), (b"x-other", b"1")]
    assert secured(plain, "http") == plain
    assert secured(plain, "https") == [
        (b"set-cookie", b"parley_inbox=x; path=/; httponly; samesite=lax; Secure"), (b"x-other", b"1")]
    already = [(b"set-cookie", b"a=b; Secure")]
    assert secured(already, "https") == already
    # the app: chosen off (a page on loopback behind a TLS proxy), reached over https
    page, _static = _pages(tmp_path, False)
    assert "secure" in page.headers["set-cookie"].lower()
