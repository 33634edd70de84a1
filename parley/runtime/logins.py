"""Which server questions a login of deploy/redis/users.acl may ask, so that no Parley process
asks one its login is refused: every refusal lands in Redis's `ACL LOG`, and an operator should
be able to treat any entry there as an alarm (tests/integration/test_acl.py checks that the
shipped processes leave none).

The shipped logins are all named `parley-…`; of those, only the dispatcher's, the worker's (and
Sentinel's, which no Parley process uses) may run `INFO`, and none may run `ACL GETUSER`. A
login named otherwise is the operator's own: it is asked, and a refusal then is the operator's
to read.
"""

from __future__ import annotations

SHIPPED_PREFIX = "parley-"
#: the shipped logins with `+info` (tests/unit/test_logins.py reads the file to keep this true)
MAY_RUN_INFO = frozenset({"parley-dispatcher", "parley-worker", "parley-sentinel"})


def shipped(username: str | None) -> bool:
    return bool(username) and str(username).startswith(SHIPPED_PREFIX)


def may_ask_info(username: str | None) -> bool:
    """Whether to ask `INFO` under this login (None: the default user, no ACL file)."""
    return not shipped(username) or username in MAY_RUN_INFO


def may_ask_acl(username: str | None) -> bool:
    """Whether to ask `ACL GETUSER` under this login."""
    return not shipped(username)
