"""A producer's view of Parley: write inputs (partitioned), read events and sessions.

`Client` (on `redis`) and `AsyncClient` (on `redis.asyncio`) run one core of steps
(core.py: routing, sending with its moved-retry, waiting for an outcome, every read); each
runner only does the I/O the steps ask for. The names are imported when first used (PEP 562):
a sync producer never loads `redis.asyncio`'s client, and a module of the package imported
alone (`parley.client.producer`'s errors, in every `parley` command) loads no runner.
"""

from typing import TYPE_CHECKING

from parley.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from parley.client.aio import AsyncClient
    from parley.client.sync import Client, shards_of

#: public name -> the module that defines it
_HOMES = {"AsyncClient": "parley.client.aio", "Client": "parley.client.sync",
          "shards_of": "parley.client.sync"}

__all__ = ["AsyncClient", "Client", "shards_of"]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
