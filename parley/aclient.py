"""`parley.aclient.AsyncClient`, as before `parley/client/` (parley/client/aio.py)."""

from parley.client.aio import AsyncClient

__all__ = ["AsyncClient"]
