"""Models an app can use as its `llm`: a deterministic scripted model, and adapters.

The names are imported when first used (PEP 562): a worker whose app brings its own model
never loads the OpenAI-compatible adapter's HTTP client (httpx), and `limits` (which every
worker reads) loads alone.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'parley.workers.llm' has no attribute {name!r}")
    value = getattr(import_module(_HOMES[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
