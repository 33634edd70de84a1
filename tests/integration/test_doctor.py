"""`parley doctor` and the dispatcher's start check against real redis-servers with the shipped
ACL file, and with the default user the file shipped before (which loses transactions)."""

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.cli.doctor import warn_if_aof_unsafe
from parley.runtime.procs import RedisServer
from tests.deployed import ADMIN, DISPATCHER, PRODUCER, SHIPPED_ACL, deployed_redis, login
from tests.forkserver import run_parley

OLD_DEFAULT_USER = "user default off resetpass resetkeys resetchannels -@all"


def old_acl() -> str:
    lines = SHIPPED_ACL.read_text().splitlines()
    return "\n".join([OLD_DEFAULT_USER, *lines[1:]]) + "\n"


@pytest.fixture
def shipped(tmp_path: Path) -> Iterator[RedisServer]:
    server = deployed_redis(tmp_path / "shipped").start()
    yield server
    server.stop(kill=True)


@pytest.fixture
def old(tmp_path: Path) -> Iterator[RedisServer]:
    server = deployed_redis(tmp_path / "old", old_acl()).start()
    yield server
    server.stop(kill=True)


def doctor(url: str) -> subprocess.CompletedProcess[str]:
    return run_parley(["--redis-url", url, "doctor"], text=True,
                          timeout=30)


def test_doctor_passes_the_shipped_deployment(shipped: RedisServer) -> None:
    run = doctor(shipped.url_as(login(ADMIN)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok      default user" in run.stdout and "ok      appendfsync: always" in run.stdout
    assert "test-admin-password" not in run.stdout  # the password is masked


def test_doctor_fails_a_default_user_the_aof_cannot_be_replayed_with(old: RedisServer) -> None:
    run = doctor(old.url_as(login(ADMIN)))
    assert run.returncode == 1
    assert "FAIL    default user" in run.stdout
    assert "user default off resetpass ~* &* +@all" in run.stdout  # what to change


@pytest.mark.parametrize("user", [PRODUCER, DISPATCHER])
def test_doctor_says_what_a_shipped_login_may_not_check_and_never_asks_it(shipped: RedisServer,
                                                                          user: str) -> None:
    admin = redis.Redis.from_url(shipped.url)
    admin.acl_log_reset()
    run = doctor(shipped.url_as(login(user)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "unknown default user" in run.stdout and "unknown appendonly" in run.stdout
    assert admin.acl_log() == []  # nothing it was refused: the ACL LOG stays an alarm


def test_a_dispatcher_with_an_admin_login_says_at_start_when_the_aof_would_lose_transactions(
        old: RedisServer, shipped: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="parley.doctor")
    assert warn_if_aof_unsafe(redis.Redis.from_url(shipped.url)) is None
    # a shipped login is not asked: it may not, and the refusal would land in the ACL LOG
    old_admin = redis.Redis.from_url(old.url)
    old_admin.acl_log_reset()
    assert warn_if_aof_unsafe(redis.Redis.from_url(old.url_as(login(DISPATCHER)))) is None
    assert caplog.records == [] and old_admin.acl_log() == []
    finding = warn_if_aof_unsafe(redis.Redis.from_url(old.url))
    assert finding is not None and "ACL LOAD" in caplog.records[-1].getMessage()
