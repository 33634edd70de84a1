"""Models an app can use as its `llm`: a deterministic scripted model, and adapters."""

from parley.workers.llm.limits import TimeLimit, current_time_limit
from parley.workers.llm.openai_compat import LLMError, LLMTimeoutError, OpenAICompatible
from parley.workers.llm.scripted import ScriptedModel

__all__ = ["LLMError", "LLMTimeoutError", "OpenAICompatible", "ScriptedModel", "TimeLimit",
           "current_time_limit"]
