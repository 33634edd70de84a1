"""Parley: agent sessions on RQ worker fleets, with durable interrupts.

The names a producer or an app needs: `Client` writes inputs and reads sessions;
`OpenAICompatible` and `ScriptedModel` are ready-made `llm`s for an app."""

from parley.client import Client
from parley.workers.llm import LLMError, LLMTimeoutError, OpenAICompatible, ScriptedModel

__all__ = ["Client", "LLMError", "LLMTimeoutError", "OpenAICompatible", "ScriptedModel"]
