"""The app behind the AG-UI endpoint's e2e test (tests/e2e/test_agui.py): a model that streams
(OpenAICompatible against tests/sse_server.py, at PARLEY_LLM_BASE_URL) and a tool that only
the desk may approve."""

from parley import OpenAICompatible, tool

instructions = "You pay invoices."

llm = OpenAICompatible(model="stream-model", stream=True, timeout=10, max_retries=2, backoff_base=0.01,
                       max_backoff=0.05)


@tool(needs_approval={"approvers": ["desk"], "message": "Pay this invoice?"})
def pay(to: str, amount: str) -> str:
    """Pay an invoice.

    to: who is paid
    amount: how much, with its currency
    """
    return f"paid {amount} to {to}"


tools = [pay]
