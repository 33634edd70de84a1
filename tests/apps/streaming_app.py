"""An app whose model streams: OpenAICompatible(stream=True) against the local server of
tests/sse_server.py, whose address the test gives in PARLEY_LLM_BASE_URL
(tests/e2e/test_streaming.py)."""

from parley import OpenAICompatible

instructions = "Answer in one sentence."

llm = OpenAICompatible(model="stream-model", stream=True, timeout=10, max_retries=2, backoff_base=0.01,
                       max_backoff=0.05)
