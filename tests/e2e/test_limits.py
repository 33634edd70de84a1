"""The dispatcher's limit flags on a real process (docs/operations.md, "Limits"): published in
parley:config for the submit function, and applied to what producers write directly."""

import os

import pytest
import redis

from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually, send, wait_for
from tests.forkserver import run_parley

pytestmark = pytest.mark.e2e
KEYS = Keys()
FIELDS = ("limit_input_bytes", "limit_pending", "limit_messages", "limit_branches")


def test_the_dispatchers_flags_are_published_and_enforced(procs: Procs, r: redis.Redis,
                                                          client: Client) -> None:
    procs.dispatcher("tests.apps.scenarios", "--max-input-bytes", "5000", "--max-pending", "7",
                     "--max-messages", "1", "--max-branches", "3", "--unknown-session-ttl", "60")
    eventually(lambda: r.hmget(KEYS.config, *FIELDS) == [b"5000", b"7", b"1", b"3"], timeout=20)

    big = send(r, "lim-big", {"type": "message.create", "content": "x" * 6000})
    refused = wait_for(client, "lim-big", lambda e: e["type"] == "input.refused")[-1]
    assert (refused["code"], refused["input"]["entry"]) == ("too_large", big)

    send(r, "lim-full", {"type": "message.create", "content": "one"})
    send(r, "lim-full", {"type": "message.create", "content": "two", "parent_id": None})
    refused = wait_for(client, "lim-full", lambda e: e["type"] == "input.refused")[-1]
    assert refused["code"] == "session_full"
    assert r.hmget(KEYS.meta("lim-full"), "n_msgs", "n_branches") == [b"1", b"1"]

    ghost = send(r, "lim-ghost", {"type": "session.close"})
    ignored = wait_for(client, "lim-ghost", lambda e: e["type"] == "input.ignored")[-1]
    assert ignored["input"]["entry"] == ghost
    assert 0 < r.ttl(KEYS.events("lim-ghost")) <= 60


def test_the_environment_sets_them_too_and_a_limit_below_one_is_a_usage_error(
        procs: Procs, r: redis.Redis) -> None:
    procs.dispatcher("tests.apps.scenarios", env={"PARLEY_MAX_MESSAGES": "42", "PARLEY_MAX_BRANCHES": "9"})
    eventually(lambda: r.hmget(KEYS.config, "limit_messages", "limit_branches") == [b"42", b"9"], timeout=20)
    bad = run_parley(["dispatcher", "--max-branches", "0"],
                         env={**os.environ, **procs.env("tests.apps.scenarios")},
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--max-branches" in bad.stderr
