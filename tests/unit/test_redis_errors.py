"""parley/runtime/redis_errors.py: what Redis's error replies mean (a stream's group gone; a Redis Cluster
node), and the one line a `parley` command exits with on a cluster node. Real replies of a real
Redis: tests/integration/test_nogroup.py and tests/integration/test_cluster.py."""

import pytest
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from parley.runtime.redis_errors import cluster_message, group_gone, is_cluster_node, is_cluster_reply

DOC = '(docs/operations.md, "Redis Cluster")'


@pytest.mark.parametrize("exc", [
    ResponseError("NOGROUP No such key 'parley:in:app' or consumer group 'parley-dispatchers' in "
                  "XREADGROUP with GROUP option"),
    ResponseError("Command # 4 (XREADGROUP GROUP g c STREAMS s >) of pipeline caused error: NOGROUP No"),
    ResponseError("UNBLOCKED the stream key no longer exists"),
])
def test_a_stream_whose_group_is_gone(exc: Exception) -> None:
    assert group_gone(exc)


@pytest.mark.parametrize("exc", [
    ResponseError("BUSYGROUP Consumer Group name already exists"), ResponseError("ERR NOGROUP"),
    ResponseError("Command # 1 (XADD s * a NOGROUP) of pipeline caused error: WRONGTYPE x"),
    ValueError("NOGROUP x"),
])
def test_other_errors_are_not_a_group_gone(exc: Exception) -> None:
    assert not group_gone(exc)


def test_info_cluster_tells_a_cluster_node() -> None:
    assert is_cluster_node({"cluster_enabled": 1})
    assert not is_cluster_node({"cluster_enabled": 0}) and not is_cluster_node({})


@pytest.mark.parametrize("exc", [
    MovedError("3999 127.0.0.1:6381"), AskError("3999 127.0.0.1:6381"), TryAgainError("x"),
    ClusterDownError("Hash slot not served"),
    ResponseError("CROSSSLOT Keys in request don't hash to the same slot"),
    ResponseError("Command # 2 (FCALL parley_submit 3 a b c) of pipeline caused error: CROSSSLOT Keys"),
    ResponseError("ERR SELECT is not allowed in cluster mode"),
    ClusterCrossSlotError("Keys in request don't hash to the same slot"),  # as redis-py parses it
    ResponseError("ERR Script attempted to access a non local key in a cluster node script"),
])
def test_replies_only_a_cluster_node_gives(exc: Exception) -> None:
    assert is_cluster_reply(exc)


@pytest.mark.parametrize("exc", [
    ResponseError("NOGROUP No such key"), ResponseError("WRONGTYPE Operation against a key"),
    ResponseError("ERR the cluster of my app is down"), ValueError("MOVED 1 a:1"),
])
def test_other_replies_are_not_taken_for_a_cluster(exc: Exception) -> None:
    assert not is_cluster_reply(exc)


def test_the_line_names_the_node_or_the_urls() -> None:
    assert cluster_message(["redis://h:7000/0"]) == (
        f"parley: redis://h:7000/0 is a Redis Cluster node; Redis Cluster is not supported {DOC}")
    assert cluster_message(["redis://a/0", "redis://b/0"]).startswith(
        "parley: one of redis://a/0, redis://b/0 is a Redis Cluster node;")
