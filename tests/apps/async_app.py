"""An app written with `async def`: its tools, `decide` and `llm` run on the worker's event loop
(tests/integration/test_worker.py)."""

import asyncio
from typing import Any

from parley import ScriptedModel, interrupt

#: the event loops the coroutines ran on, one entry per call: one loop for the worker's life
LOOPS: list[int] = []


async def add(a: int, b: int) -> int:
    """Add two numbers, after yielding to the loop."""
    await asyncio.sleep(0)
    LOOPS.append(id(asyncio.get_running_loop()))
    return a + b


async def nap(seconds: float) -> str:
    """Sleep on the loop (a time limit cancels it)."""
    await asyncio.sleep(seconds)
    return "rested"


nap.timeout_s = 1  # type: ignore[attr-defined]


async def fail() -> str:
    """Raise after an await."""
    await asyncio.sleep(0)
    raise LookupError("no such invoice")


async def pick(options: list[str]) -> str:
    """Ask which option, from inside an async tool."""
    await asyncio.sleep(0)
    picked = interrupt("pick", {"options": options})
    await asyncio.sleep(0)
    return f"picked {picked}"


async def decide(trigger: Any, proposed: Any) -> Any:
    await asyncio.sleep(0)
    return proposed


_model = ScriptedModel()


async def llm(request: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _model(request)


tools = [add, nap, fail, pick]
