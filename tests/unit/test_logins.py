"""parley/runtime/logins.py names which shipped logins may ask INFO and ACL GETUSER: read from
deploy/redis/users.acl itself, so the rule cannot drift from the file."""

import re

from parley.runtime.logins import MAY_RUN_INFO, SHIPPED_PREFIX, may_ask_acl, may_ask_info
from tests.deployed import SHIPPED_ACL


def enabled_users() -> dict[str, str]:
    return {m.group(1): line for line in SHIPPED_ACL.read_text().splitlines()
            if (m := re.match(r"user (\S+) on ", line))}


def test_every_shipped_login_is_named_with_the_prefix() -> None:
    assert enabled_users() and all(name.startswith(SHIPPED_PREFIX) for name in enabled_users())


def test_exactly_the_logins_with_info_are_asked_info() -> None:
    with_info = {name for name, line in enabled_users().items() if re.search(r"(^| )\+info( |$)", line)}
    assert with_info == MAY_RUN_INFO
    assert {name for name in enabled_users() if may_ask_info(name)} == with_info


def test_no_shipped_login_is_asked_the_acl_and_the_operators_own_are() -> None:
    assert not any(re.search(r"\+acl|\+@all|\+@admin", line) for line in enabled_users().values())
    assert not any(may_ask_acl(name) for name in enabled_users())
    assert may_ask_acl(None) and may_ask_acl("ops-admin") and may_ask_info("ops-admin") and may_ask_info(None)
