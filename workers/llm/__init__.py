"""Models an app can use as its `llm`: a deterministic scripted model, and adapters.

The names are imported when first used (PEP 562): a worker whose app brings its own model
never loads the OpenAI-compatible adapter's HTTP client (httpx), and `limits` (which every
worker reads) loads alone.
"""

from typing import TYPE_CHECKING

from parley.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from parley.workers.llm.limits import TimeLimit, current_time_limit
    from parley.workers.llm.openai_compat import LLMError, LLMTimeoutError, OpenAICompatible
    from parley.workers.llm.scripted import ScriptedModel

#: public name -> the module that defines it
_HOMES = {
    "LLMError": "parley.workers.llm.openai_compat",
    "LLMTimeoutError": "parley.workers.llm.openai_compat",
    "OpenAICompatible": "parley.workers.llm.openai_compat",
    "ScriptedModel": "parley.workers.llm.scripted",
    "TimeLimit": "parley.workers.llm.limits",
    "current_time_limit": "parley.workers.llm.limits",
}

__all__ = ["LLMError", "LLMTimeoutError", "OpenAICompatible", "ScriptedModel", "TimeLimit",
           "current_time_limit"]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
