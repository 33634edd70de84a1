"""`parley.interrupt()`: a tool asks a person from inside its own code (README, "Asking from
inside a tool"; docs/protocol.md, "A tool's own questions").

LangGraph's semantics: a tool's run has the answers its call has been given so far, in order.
Its N-th `interrupt()` returns the N-th answer; the first one past them stops the run
(`ToolAsked`), and the worker posts the question as the job's outcome instead of a result.
The branch parks as it does for a decision's interrupt; once the question is answered, the
tool runs again *from its start* with one more answer. So whatever the tool did before its
question it does again on every run: a side effect belongs after the last question, or must
be safe to repeat.

The answers live in the session's state (`Work.answers`), not in any process: a question
outlives worker and dispatcher restarts, and a tool may ask several, one after another.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from parley.schemas.actions import InterruptAction


class ToolAsked(BaseException):
    """A tool's question with no answer yet: what the worker posts instead of the tool's result.

    A BaseException, as asyncio's CancelledError is: a tool's `except Exception` around the
    call (or around code that calls it) must not swallow the question, or the tool would run
    on without its answer."""

    def __init__(self, question: dict[str, Any]):
        super().__init__(question.get("reason"))
        self.question = question


@dataclass
class _Run:
    """The answers of the call a tool runs for, and how many of them this run has used."""

    given: list[Any]
    used: int = 0


_RUN: ContextVar[_Run | None] = ContextVar("parley_tool_run", default=None)


def interrupt(reason: str, payload: Any = None, *, response_schema: dict[str, Any] | None = None,
              timeout_s: float | None = None, default: Any = None,
              resumable_by: list[str] | None = None) -> Any:
    """Ask a person from inside a tool; returns their answer (the resume's payload).

    The first time, the tool stops here: the branch parks on an interrupt with this `reason`
    and `payload`, as a decision's `Interrupt` action would raise, and a resume answers it
    (checked against `response_schema`, when given; only `resumable_by`'s signers may, when
    given; `default` is the answer once `timeout_s` passes unanswered). The tool then runs
    again from its start, and this call returns the answer. Call it in the same order on every
    run: answers are matched to questions by their place, not their text.

    Only inside a tool a worker (or `parley.testing`) runs: `decide` returns an `Interrupt`
    action instead."""
    run = _RUN.get()
    if run is None:
        raise RuntimeError("parley.interrupt() asks from inside a tool that Parley runs (a worker, or "
                           "parley.testing); in `decide`, return an Interrupt action instead")
    fields: dict[str, Any] = {"reason": reason, "payload": payload}
    optional = {"response_schema": response_schema, "timeout_s": timeout_s, "resumable_by": resumable_by}
    fields.update({k: v for k, v in optional.items() if v is not None})
    if timeout_s is not None:
        fields["default"] = default
    question = _checked(fields)
    if run.used < len(run.given):
        answer = run.given[run.used]
        run.used += 1
        return answer
    raise ToolAsked(question)


def _checked(fields: dict[str, Any]) -> dict[str, Any]:
    """The question as the engine will read it; a mistake raises here, in the tool's own code,
    where its author sees it (a ValueError with one readable line)."""
    try:
        action = InterruptAction.model_validate({"type": "interrupt", **fields})
    except ValidationError as exc:
        wrong = "; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}"
                          for e in exc.errors(include_url=False))
        raise ValueError(f"parley.interrupt(): {wrong}") from None
    try:
        question: dict[str, Any] = orjson.loads(orjson.dumps(
            action.model_dump(exclude_unset=True, exclude={"type"})))
    except TypeError as exc:
        raise ValueError(f"parley.interrupt(): the payload and default must be JSON values: {exc}") from None
    return question


@contextmanager
def answering(given: list[Any]) -> Iterator[None]:
    """Run a tool's body with its call's answers so far (`interrupt()` reads them)."""
    token = _RUN.set(_Run(list(given)))
    try:
        yield
    finally:
        _RUN.reset(token)
