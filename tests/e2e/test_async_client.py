"""The async client on real processes: it drives the seed scenario (examples/seed_app.py,
a dispatcher and a worker) from the first message, through the approval it awaits the
outcome of, through a budget stop, to the reply."""

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio

from parley import AsyncClient
from parley.schemas.events import Event, InterruptRaised, MessageCreated, TurnCompleted
from parley.schemas.inputs import Budget, MessageCreate, SessionCreate
from parley.schemas.resumes import ResumeStatus
from tests.conftest import Procs

pytestmark = pytest.mark.e2e

SEED = "Email bob@example.com: the launch moved to Friday."


async def next_of(client: AsyncClient, session: str, after: str, kind: type[Any],
                  timeout: float = 20) -> tuple[str, Any]:
    """The first event of `kind` after `after`, and its id."""
    seen: list[Event] = []
    async for entry_id, event in client.watch(session, after, until=time.monotonic() + timeout, block_ms=200):
        seen.append(event)
        if isinstance(event, kind):
            return entry_id, event
    raise AssertionError(f"no {kind.__name__} within {timeout}s; saw {[e.type for e in seen]}")


async def listed(client: AsyncClient, timeout: float = 5) -> list[dict[str, Any]]:
    """The open interrupts once the listing has some: its index follows the commit (the outbox
    flush), so it may lag the `interrupt.raised` event by a moment."""
    deadline = time.monotonic() + timeout
    while not (rows := await client.interrupts()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return rows


async def seed_scenario(url: str) -> dict[str, Any]:
    conn = redis.asyncio.Redis.from_url(url)
    client = AsyncClient(conn)
    try:
        await client.send("a", SessionCreate(type="session.create", budget=Budget(llm_calls=1)))
        await client.send("a", MessageCreate(type="message.create", content=SEED))
        at, question = await next_of(client, "a", "0-0", InterruptRaised)
        assert question.reason == "confirm" and question.payload == {"message": "Send the email?"}
        [row] = await listed(client)
        assert (row["session"], row["interrupt_id"]) == ("a", question.interrupt_id)

        outcome = await client.resume("a", question.interrupt_id, {"approved": True}, wait=True, timeout_s=20)
        assert outcome.status is ResumeStatus.DELIVERED, outcome.describe()
        # the reply after the tool result would be a second model call: the budget stops it
        at, stop = await next_of(client, "a", at, InterruptRaised)
        assert stop.reason == "budget"
        more = {"budget": {"llm_calls": 5}}
        raised = await client.resume("a", stop.interrupt_id, more, wait=True, timeout_s=20)
        assert raised.status is ResumeStatus.DELIVERED, raised.describe()
        await next_of(client, "a", at, TurnCompleted)
        return {"view": await client.show("a"), "open": await client.interrupts(),
                "replies": [e.message["content"] async for _id, e in
                            client.watch("a", until=time.monotonic() + 0.3, block_ms=50)
                            if isinstance(e, MessageCreated)]}
    finally:
        await conn.aclose()


def test_the_async_client_drives_the_seed_scenario_to_its_reply(procs: Procs) -> None:
    procs.dispatcher("examples.seed_app")
    procs.worker("examples.seed_app")
    result = asyncio.run(seed_scenario(procs.url))
    assert result["replies"][-1] == "Done. send_email: sent"
    assert result["open"] == [] and result["view"]["parked"] is False
