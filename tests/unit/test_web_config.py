"""The inbox's cookie and cache choices (parley/web/config.py, parley/web/observe.py)."""

import pytest

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
