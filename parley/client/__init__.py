"""A producer's view of Parley: write inputs (partitioned), read events and sessions.

`Client` (on `redis`) and `AsyncClient` (on `redis.asyncio`) run one core of steps
(core.py: routing, sending with its moved-retry, waiting for an outcome, every read); each
runner only does the I/O the steps ask for. The names are imported when first used (PEP 562):
a sync producer never loads `redis.asyncio`'s client, and a module of the package imported
alone (`parley.client.producer`'s errors, in every `parley` command) loads no runner.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parley.client.aio import AsyncClient
    from parley.client.sync import Client, shards_of

#: public name -> the module that defines it
_HOMES = {"AsyncClient": "parley.client.aio", "Client": "parley.client.sync",
          "shards_of": "parley.client.sync"}

__all__ = ["AsyncClient", "Client", "shards_of"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'parley.client' has no attribute {name!r}")
    value = getattr(import_module(_HOMES[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
