"""A producer's view of Parley: write inputs (partitioned), read events and sessions.

`Client` (on `redis`) and `AsyncClient` (on `redis.asyncio`) run one core of steps
(core.py: routing, sending with its moved-retry, waiting for an outcome, every read); each
runner only does the I/O the steps ask for. `AsyncClient` is imported when first used (PEP
562), so a sync producer never loads `redis.asyncio`'s client.
"""

from typing import TYPE_CHECKING, Any

from parley.client.sync import Client, shards_of

if TYPE_CHECKING:
    from parley.client.aio import AsyncClient

__all__ = ["AsyncClient", "Client", "shards_of"]


def __getattr__(name: str) -> Any:
    if name != "AsyncClient":
        raise AttributeError(f"module 'parley.client' has no attribute {name!r}")
    from parley.client.aio import AsyncClient

    return AsyncClient
