"""Parley: agent sessions on RQ worker fleets, with durable interrupts.

The names a producer or an app needs: `Client` writes inputs and reads sessions (and
`AsyncClient`, the same on `redis.asyncio`; `InvalidInput` is what both raise, before
sending, for an input a dispatcher would refuse; `SubmitRefused` and `SubmitUnavailable`
what the submit function answers when a client names its producer);
`OpenAICompatible` and `ScriptedModel` are ready-made `llm`s for an app; `Trigger` and
`Decision` type what an app's `decide(trigger, proposed)` receives and returns, and the
actions it may return are models too (`Interrupt`, `Message`, `ToolExecute`, `ToolResult`,
`ToolError`, `LlmCall`; an app needs no import from Parley: plain dicts do); `needs_approval`
marks a tool whose calls run only once a person approved them; `interrupt()`, called in a
tool's code, asks a person and returns their answer (the tool runs again from its start);
`@tool(...)` declares a tool's name, description and kind where it is defined;
`stream_delta(text)`, called in an `llm`, streams a piece of the reply to the session's
watchers (`OpenAICompatible(stream=True)` calls it for you).

They are imported when first used (PEP 562), so that importing one part of the package
(`parley.client` in a producer, `parley.dispatcher.core`) loads no other: a producer never
loads the model adapters' HTTP client, nor the dispatcher.
"""

from typing import TYPE_CHECKING

from parley.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from parley.client import Client
    from parley.client.aio import AsyncClient
    from parley.client.producer import InvalidInput, SubmitRefused, SubmitUnavailable
    from parley.schemas.actions import Decision, InvalidDecision, LlmCall, ToolError, ToolExecute, ToolResult
    from parley.schemas.actions import InterruptAction as Interrupt
    from parley.schemas.actions import MessageAction as Message
    from parley.schemas.approvals import needs_approval
    from parley.schemas.triggers import Trigger
    from parley.workers.asking import interrupt
    from parley.workers.llm import LLMError, LLMTimeoutError, OpenAICompatible, ScriptedModel
    from parley.workers.streaming import stream_delta
    from parley.workers.tool_marks import tool

#: public name -> the module that defines it
_HOMES = {
    "AsyncClient": "parley.client.aio",
    "Client": "parley.client",
    "InvalidInput": "parley.client.producer",
    "SubmitRefused": "parley.client.producer",
    "SubmitUnavailable": "parley.client.producer",
    "Decision": "parley.schemas.actions",
    "InvalidDecision": "parley.schemas.actions",
    "Interrupt": "parley.schemas.actions:InterruptAction",
    "LlmCall": "parley.schemas.actions",
    "Message": "parley.schemas.actions:MessageAction",
    "ToolError": "parley.schemas.actions",
    "ToolExecute": "parley.schemas.actions",
    "ToolResult": "parley.schemas.actions",
    "needs_approval": "parley.schemas.approvals",
    "Trigger": "parley.schemas.triggers",
    "LLMError": "parley.workers.llm",
    "LLMTimeoutError": "parley.workers.llm",
    "OpenAICompatible": "parley.workers.llm",
    "ScriptedModel": "parley.workers.llm",
    "interrupt": "parley.workers.asking",
    "stream_delta": "parley.workers.streaming",
    "tool": "parley.workers.tool_marks",
}

__all__ = ["AsyncClient", "Client", "Decision", "Interrupt", "InvalidDecision", "InvalidInput", "LLMError",
           "LLMTimeoutError", "LlmCall", "Message", "OpenAICompatible", "ScriptedModel", "SubmitRefused",
           "SubmitUnavailable", "ToolError", "ToolExecute", "ToolResult", "Trigger", "interrupt",
           "needs_approval", "stream_delta", "tool"]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
