"""The dispatcher's lifecycle flags (docs/operations.md, "Retention and archive"): each reaches
the dispatcher as given, from the command line or the environment, and a bad value is a usage
error that names the flag (exit 2), before anything starts."""

from typing import Any

import pytest
import redis
from click.testing import CliRunner

from parley.cli import cli, processes
from parley.dispatcher import consume
from parley.dispatcher.core import Lifecycle


class Stop(Exception):
    """Raised by the stand-in Dispatcher: what it was given is all the test wants."""


@pytest.fixture
def given(monkeypatch: pytest.MonkeyPatch, r: redis.Redis) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise Stop()

    monkeypatch.setattr(consume, "Dispatcher", capture)
    monkeypatch.setattr(processes, "_stop_on_signals", lambda: None)
    url = r.connection_pool.connection_kwargs
    seen["url"] = f"redis://{url['host']}:{url['port']}/0"
    return seen


def run(given: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["--redis-url", given["url"], "dispatcher", "--app", "examples.seed_app",
                                    *args], env=env or {})


def test_the_defaults(given: dict[str, Any]) -> None:
    result = run(given)
    assert isinstance(result.exception, Stop), result.output
    assert given["lifecycle"] == Lifecycle(retention_ms=7 * 24 * 3600 * 1000, idle_timeout_ms=None)
    assert (given["events_maxlen"], given["archive_maxlen"]) == (10_000, 10_000)


def test_flags_reach_the_dispatcher(given: dict[str, Any]) -> None:
    result = run(given, "--retention", "0", "--idle-timeout", "90", "--events-maxlen", "500",
                 "--archive-maxlen", "20")
    assert isinstance(result.exception, Stop), result.output
    assert given["lifecycle"] == Lifecycle(retention_ms=0, idle_timeout_ms=90_000)
    assert (given["events_maxlen"], given["archive_maxlen"]) == (500, 20)


def test_the_environment_and_no_archive(given: dict[str, Any]) -> None:
    result = run(given, env={"PARLEY_RETENTION": "60", "PARLEY_IDLE_TIMEOUT": "5",
                             "PARLEY_EVENTS_MAXLEN": "7", "PARLEY_NO_ARCHIVE": "1"})
    assert isinstance(result.exception, Stop), result.output
    assert given["lifecycle"] == Lifecycle(retention_ms=60_000, idle_timeout_ms=5_000)
    assert (given["events_maxlen"], given["archive_maxlen"]) == (7, 0)  # 0: no archive


@pytest.mark.parametrize(("args", "flag"), [
    (["--retention", "-1"], "--retention"),
    (["--retention", "a week"], "--retention"),
    (["--idle-timeout", "0"], "--idle-timeout"),
    (["--events-maxlen", "0"], "--events-maxlen"),
    (["--archive-maxlen", "0"], "--archive-maxlen"),
])
def test_a_bad_value_is_a_usage_error_naming_its_flag(given: dict[str, Any], args: list[str],
                                                       flag: str) -> None:
    result = run(given, *args)
    assert result.exit_code == 2 and flag in result.output, result.output
    assert "lifecycle" not in given  # nothing started
