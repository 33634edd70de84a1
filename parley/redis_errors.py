"""What some of Redis's error replies mean to Parley's loops and commands: pure functions of an
exception (or of `INFO`'s answer), written and unit-tested once (tests/unit/test_redis_errors.py).
Like parley/retry.py it sits below dispatcher/, workers/ and parley/cli/, and imports nothing of
Parley.
"""

from redis.exceptions import ResponseError

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
