"""The seed flow as a Restate workflow (scenario 5's Restate row, bench/peer_restate.py), served
as an ASGI app: `python -m hypercorn bench.restate_service:app --bind HOST:PORT`.

`run`: `llm` (a durable step, scripted: asks for send_email) -> an awakeable for the human,
whose id is kept in the workflow's state (`awakeable`, read by the shared handler of that name:
what a client watches for, as Parley's `interrupt.raised`) -> `send_email` (a step: sends, or
declines, by the awakeable's answer) -> `llm2` (a step: "Done. send_email: sent")."""

from typing import Any

import restate
from restate import Workflow, WorkflowContext, WorkflowSharedContext

SEND = {"id": "call-1", "name": "send_email",
        "arguments": {"to": "bob@example.com", "body": "the launch moved to Friday."}}

seed = Workflow("seed")


async def llm(message: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [SEND]}


async def send_email(approved: bool) -> str:
    return "sent" if approved else "declined"


async def llm2(result: str) -> str:
    return f"Done. send_email: {result}"


@seed.main()
async def run(ctx: WorkflowContext, message: str) -> str:
    await ctx.run_typed("llm", llm, message=message)
    name, answer = ctx.awakeable(type_hint=dict)
    ctx.set("awakeable", name)
    approval = await answer
    result = await ctx.run_typed("send_email", send_email, approved=bool(approval.get("approved")))
    return await ctx.run_typed("llm2", llm2, result=result)


@seed.handler()
async def awakeable(ctx: WorkflowSharedContext) -> str | None:
    return await ctx.get("awakeable", type_hint=str)


app = restate.app(services=[seed])
