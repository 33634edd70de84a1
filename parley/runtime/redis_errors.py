"""What some of Redis's error replies mean to Parley's loops and commands: pure functions of an
exception (or of `INFO`'s answer), written and unit-tested once (tests/unit/test_redis_errors.py).
Like parley/runtime/retry.py it sits below dispatcher/, workers/ and parley/cli/, and imports nothing of
Parley.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterDownError,
    ResponseError,
    TryAgainError,
)

#: what a reader blocked in XREADGROUP is answered when its stream is deleted (Redis 7)
STREAM_DELETED = "UNBLOCKED the stream key no longer exists"
#: what redis-py puts before an error reply of a pipeline's command
PIPELINE_PREFIX = " of pipeline caused error: "


def group_gone(exc: BaseException) -> bool:
    """A stream read with a consumer group lost the group: the stream was deleted (its group
    goes with it) or the group destroyed. The reply `NOGROUP` (no such key or consumer group),
    or, to a read blocked on the stream when it was deleted, `UNBLOCKED the stream key no longer
    exists`; alone or as one of a pipeline's replies."""
    if not isinstance(exc, ResponseError) or not exc.args:
        return False
    message = str(exc.args[0])
    if PIPELINE_PREFIX in message:
        message = message.split(PIPELINE_PREFIX, 1)[1]
    return message.startswith(("NOGROUP ", STREAM_DELETED))


# ---- Redis Cluster: not supported (docs/operations.md, "Redis Cluster") -------------------------

#: where the docs say why
CLUSTER_DOC = 'docs/operations.md, "Redis Cluster"'
#: the start of an error reply only a Redis Cluster node gives (but those redis-py has classes for)
CLUSTER_REPLIES = ("CROSSSLOT ", "CLUSTERDOWN ", "MOVED ", "ASK ", "TRYAGAIN ")
#: what a cluster node says of a `SELECT` (a database other than 0), and of a script reaching a
#: key of another slot than those it was called with
CLUSTER_MESSAGES = ("not allowed in cluster mode", "non local key in a cluster node",
                    "hash to the same slot")


def is_cluster_node(info: Mapping[str, Any]) -> bool:
    """`INFO cluster`'s answer (as redis-py parses it) says this is a Redis Cluster node."""
    return str(info.get("cluster_enabled", 0)) == "1"


def is_cluster_reply(exc: BaseException) -> bool:
    """An error reply only a Redis Cluster node gives: a key of a slot served elsewhere (MOVED,
    ASK), slots served by nobody (CLUSTERDOWN), keys of several slots in one command or script
    (CROSSSLOT), a slot being moved (TRYAGAIN), `SELECT` of a database other than 0. What a
    command meets there when its login may not run `INFO` (a producer's, a reader's)."""
    # redis-py gives these replies classes of their own (MovedError is an AskError), the code
    # cut off the message
    if isinstance(exc, AskError | ClusterDownError | TryAgainError | ClusterCrossSlotError):
        return True
    if not isinstance(exc, ResponseError) or not exc.args:
        return False
    message = str(exc.args[0])
    if PIPELINE_PREFIX in message:
        message = message.split(PIPELINE_PREFIX, 1)[1]
    return message.startswith(CLUSTER_REPLIES) or any(m in message for m in CLUSTER_MESSAGES)


def cluster_message(urls: Sequence[str]) -> str:
    """The one line every `parley` command exits with on a Redis Cluster node; `urls` as they
    may be shown (no password): the node's, or a deployment's when which one is not known."""
    where = urls[0] if len(urls) == 1 else "one of " + ", ".join(urls)
    return f"parley: {where} is a Redis Cluster node; Redis Cluster is not supported ({CLUSTER_DOC})"
