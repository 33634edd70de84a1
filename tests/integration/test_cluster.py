"""Pointed at a Redis Cluster node, every `parley` command exits at once with one line on stderr,
`parley: <url> is a Redis Cluster node; Redis Cluster is not supported (docs/operations.md,
"Redis Cluster")`, and exit code 78, never a traceback or a loop retrying MOVED (issue 29).

Real cluster-enabled redis-servers: one holding every slot (it would serve single keys, so only
`INFO cluster` tells, at connect), and a pair where the first holds no slot and answers MOVED for
every key, asked by a login that may not run INFO (a producer's or a reader's): the line then
comes from the reply, at the top of the command line. The pure part: tests/unit/test_redis_errors.py."""

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from parley.runtime.procs import RedisServer, free_port
from tests.integration.test_cli_errors import COMMAND_ARGS, run_parley

REDIS_CLUSTER = 78
SLOTS = 16384
DOC = '(docs/operations.md, "Redis Cluster")'
#: a login that may do anything but INFO, as the producer, reader and inbox logins of
#: deploy/redis/users.acl
NO_INFO = ("reader", "reader-password")


def cluster_node(directory: Path) -> tuple[RedisServer, redis.Redis]:
    # the cluster bus's port given too: by default it is the port + 10000, maybe taken or > 65535
    server = RedisServer(directory, settings={"cluster-enabled": "yes", "cluster-port": str(free_port()),
                                              "cluster-config-file": str(directory / "nodes.conf")})
    server.start()
    node = redis.Redis(port=server.port)
    node.acl_setuser(NO_INFO[0], enabled=True, passwords=[f"+{NO_INFO[1]}"], keys=["*"],
                     channels=["*"], commands=["+@all", "-info"])
    return server, node


def wait_until(check: object, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the cluster did not settle"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def whole_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One node holding every slot (cluster_state:ok): the admin's URL."""
    server, node = cluster_node(tmp_path_factory.mktemp("cluster") / "node")
    try:
        node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, SLOTS - 1)
        wait_until(lambda: b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO"))
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(kill=True)


@pytest.fixture(scope="module")
def moving_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Two nodes, the second holding every slot: the first answers MOVED for every key. Its port."""
    tmp_path = tmp_path_factory.mktemp("cluster-pair")
    first, a = cluster_node(tmp_path / "a")
    second, b = cluster_node(tmp_path / "b")
    try:
        b.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, SLOTS - 1)
        a.execute_command("CLUSTER", "MEET", "127.0.0.1", second.port, second.settings["cluster-port"])
        wait_until(lambda: b"cluster_state:ok" in a.execute_command("CLUSTER", "INFO"))
        yield first.port
    finally:
        first.stop(kill=True)
        second.stop(kill=True)


def one_line(out: subprocess.CompletedProcess[str], url: str) -> None:
    assert out.returncode == REDIS_CLUSTER, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"parley: {url} is a Redis Cluster node; Redis Cluster is not supported {DOC}"), out.stderr


@pytest.mark.parametrize("command", sorted(COMMAND_ARGS))
def test_every_command_on_a_cluster_node_is_one_line_and_exit_78(whole_cluster: str, command: str) -> None:
    started = time.monotonic()
    out = run_parley("--redis-url", whole_cluster, command, *COMMAND_ARGS[command])
    one_line(out, whole_cluster)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("command", ["send", "sessions", "show", "interrupts", "producers"])
def test_a_login_without_info_gets_the_line_from_moved(moving_node: int, command: str) -> None:
    """The producer, reader and inbox logins may not run INFO: the command meets MOVED instead,
    and says the same line (every URL given, with its password masked)."""
    url = f"redis://{NO_INFO[0]}:{NO_INFO[1]}@127.0.0.1:{moving_node}/0"
    out = run_parley("--redis-url", url, command, *COMMAND_ARGS[command])
    one_line(out, f"redis://{NO_INFO[0]}:***@127.0.0.1:{moving_node}/0")
    assert NO_INFO[1] not in out.stderr


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_a_login_without_info_gets_the_line_from_crossslot(whole_cluster: str, command: str) -> None:
    """On a node holding every slot, single keys are served: a login without INFO goes on until
    its first command over keys of several slots (CROSSSLOT), then says the same line."""
    port = whole_cluster.split(":")[2].split("/")[0]
    url = f"redis://{NO_INFO[0]}:{NO_INFO[1]}@127.0.0.1:{port}/0"
    out = run_parley("--redis-url", url, command, *COMMAND_ARGS[command])
    one_line(out, f"redis://{NO_INFO[0]}:***@127.0.0.1:{port}/0")
