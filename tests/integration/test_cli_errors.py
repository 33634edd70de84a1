"""A Redis the CLI cannot use (down, a wrong port, a refused password) is one line on stderr and
exit code 69, whatever the command: never a traceback (docs/operations.md, "Exit codes").
And `-v` says which Redis and prefix a command uses, the password masked."""

import os
import subprocess
from pathlib import Path

import click
import pytest
import redis

from parley.cli import cli
from parley.runtime.procs import free_port
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]
REDIS_UNAVAILABLE = 69

#: arguments that get each command as far as Redis (every command of the group is listed: the
#: test below fails when one is added without its line here)
COMMAND_ARGS: dict[str, list[str]] = {
    "dispatcher": ["--app", "examples.seed_app"],
    "worker": ["--app", "examples.seed_app", "--burst"],
    "send": ["s1", "hello"],
    "resume": ["s1", "int-1", '{"approved": true}'],
    "close": ["s1", "--reason", "done", "--wait"],
    "switch": ["s1", "msg-1"],
    "input": ["s1", '{"type": "session.create"}'],
    "show": ["s1"],
    "watch": ["s1", "--timeout", "1"],
    "interrupts": ["--json"],
    "export": ["s1"],
    "sessions": ["--json"],
    "demo": ["--yes"],
    "notify": ["--webhook", "http://127.0.0.1:1/hook"],
    "producers": ["list"],
    "partitions": ["list"],
    "doctor": [],
    "agui": ["--port", "1"],
    "inbox": ["--users-file", str(ROOT / "deploy/secrets/inbox-users.json"),
              "--keys-file", str(ROOT / "deploy/secrets/keys.json")],
}
#: the commands that never use Redis
NO_REDIS = {"inbox-user", "app"}


#: what a command needs in its environment besides the Redis URL
COMMAND_ENV: dict[str, dict[str, str]] = {"notify": {"PARLEY_WEBHOOK_SECRET": "a-secret"}}


def run_parley(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith("PARLEY_")} | {"PYTHONPATH": env["PYTHONPATH"]}
    command = next((a for a in args if a in COMMAND_ENV), None)
    env |= COMMAND_ENV.get(command or "", {})
    return forkserver.run_parley([*args], env, text=True, timeout=60)


def test_every_command_is_covered() -> None:
    with click.Context(cli) as ctx:
        assert set(COMMAND_ARGS) | NO_REDIS == set(cli.list_commands(ctx))


@pytest.mark.parametrize("command", sorted(COMMAND_ARGS))
def test_a_closed_port_is_one_line_and_exit_69(command: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    out = run_parley("--redis-url", url, command, *COMMAND_ARGS[command])
    assert out.returncode == REDIS_UNAVAILABLE, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"parley: cannot use Redis at {url}: "), out.stderr
    assert "Connection refused" in last or "connecting" in last


@pytest.mark.parametrize("command", ["send", "show", "interrupts", "dispatcher", "worker"])
def test_a_refused_password_is_one_line_without_the_password(r: redis.Redis, command: str) -> None:
    r.acl_setuser("alice", enabled=True, passwords=["+right-one"], keys=["*"], commands=["+@all"])
    port = r.connection_pool.connection_kwargs["port"]
    out = run_parley("--redis-url", f"redis://alice:wrong-one@127.0.0.1:{port}/0", command,
                     *COMMAND_ARGS[command])
    assert out.returncode == REDIS_UNAVAILABLE, out.stderr
    assert "Traceback" not in out.stderr and "wrong-one" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"parley: cannot use Redis at redis://alice:***@127.0.0.1:{port}/0: ")
    assert "password" in last.lower()


def test_verbose_says_which_redis_and_prefix(r: redis.Redis) -> None:
    port = r.connection_pool.connection_kwargs["port"]
    r.acl_setuser("bob", enabled=True, passwords=["+hunter2"], keys=["*"], commands=["+@all"])
    out = run_parley("-v", "--redis-url", f"redis://bob:hunter2@127.0.0.1:{port}/0", "--prefix",
                     "acme:parley", "interrupts", "--json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert f"parley: redis redis://bob:***@127.0.0.1:{port}/0, prefix acme:parley" in out.stderr
    assert "hunter2" not in out.stderr
    quiet = run_parley("--redis-url", f"redis://bob:hunter2@127.0.0.1:{port}/0", "interrupts", "--json")
    assert "parley: redis" not in quiet.stderr


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://localhost:6379/0", "redis://localhost:6379/0"),
    ("redis://:s3cret@h:6380/0", "redis://:***@h:6380/0"),
    ("rediss://alice:p%40ss@h/1", "rediss://alice:***@h/1"),
    ("redis://alice@h/0", "redis://alice@h/0"),
    ("unix:///run/redis.sock?db=0&password=s3cret", "unix:///run/redis.sock?db=0&password=***"),
])
def test_masked_url_hides_only_the_password(url: str, shown: str) -> None:
    from parley.cli.main import masked_url

    assert masked_url(url) == shown


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
@pytest.mark.parametrize("value", ["5", "10001", "soon"])
def test_an_idle_block_out_of_its_range_is_a_usage_error(command: str, value: str) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [command, "--app", "tests.apps.scenarios", "--idle-block-ms", value])
    assert result.exit_code == 2, result.output
    assert "--idle-block-ms" in result.output
