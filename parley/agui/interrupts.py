"""Parley's open interrupts as AG-UI interrupts, and AG-UI resume entries as Parley resumes (pure).

Parley is richer than AG-UI here, and the mapping says how (docs/agui.md):
- AG-UI's `cancelled` has no Parley input: an interrupt with a deadline is answered with its
  `default`, the answer its deadline would have given; one without a deadline cannot be
  cancelled (the run ends with an error, and nothing is sent).
- A run may answer some of the open interrupts and leave others open (Parley answers them one
  by one); those stay open and the run ends with them again.
- A resume entry is checked here as the engine will check it (the interrupt open, the
  answer matching its `response_schema`, the endpoint's principal among `resumable_by`), so
  that a run whose entries cannot all be delivered sends none of them: AG-UI's resume is all
  or nothing. The engine checks every resume again when it applies it.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ag_ui.core import Interrupt, ResumeEntry

from parley.agui.runs import RunProblem
from parley.client.inbox import OpenInterrupt
from parley.schemas.answers import mismatch
from parley.schemas.events import InterruptRaised


def iso_of(unix_ms: int) -> str:
    when = datetime.fromtimestamp(unix_ms / 1000, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def tool_call_of(row: OpenInterrupt, raised: InterruptRaised | None) -> str | None:
    """The tool call an interrupt is about: the call whose code asked it (`parley.interrupt()`),
    or the call an approval question asks about."""
    if raised is not None and raised.call_id is not None:
        return raised.call_id
    if row.reason == "approval" and isinstance(row.request, dict):
        call = row.request.get("call_id")
        return call if isinstance(call, str) else None
    return None


def agui_interrupt(row: OpenInterrupt, raised: InterruptRaised | None = None) -> Interrupt:
    """One open interrupt as AG-UI shows it. The question itself (Parley's `payload`), the
    answer a deadline gives and who may answer go in `metadata.parley`."""
    request = row.request
    message = request.get("message") if isinstance(request, dict) else None
    parley: dict[str, Any] = {"session": row.session, "request": request, "anchor": row.anchor,
                              "resumableBy": row.resumable_by}
    if row.expires_at is not None:
        parley["default"] = row.default
    return Interrupt(
        id=row.interrupt_id, reason=row.reason,
        message=message if isinstance(message, str) else None,
        tool_call_id=tool_call_of(row, raised),
        response_schema=row.response_schema,
        expires_at=iso_of(row.expires_at) if row.expires_at is not None else None,
        metadata={"parley": parley})


@dataclass(frozen=True, slots=True)
class Answer:
    """One Parley resume to send."""

    interrupt_id: str
    payload: Any
    #: AG-UI's `cancelled`, answered with the interrupt's default
    cancelled: bool


def answers_of(entries: Sequence[ResumeEntry], rows: Mapping[str, OpenInterrupt | None],
               principal: str | None) -> list[Answer]:
    """The resumes a run's entries make, every one checked first; RunProblem (and nothing to
    send) when any of them cannot be delivered. `rows`: each entry's interrupt as open now
    (None: not open)."""
    answers = []
    for entry in entries:
        row = rows.get(entry.interrupt_id)
        if row is None:
            raise RunProblem("unknown_interrupt", f"interrupt {entry.interrupt_id!r} is not open in this "
                             "thread (answered already, cancelled, or never raised)")
        if row.resumable_by is not None and principal not in row.resumable_by:
            who = f"principal {principal!r}" if principal else "an unsigned resume"
            raise RunProblem("forbidden", f"interrupt {row.interrupt_id!r} may be answered only by "
                             f"{', '.join(row.resumable_by) or 'nobody'}; this endpoint sends {who}")
        if entry.status == "cancelled":
            if row.expires_at is None:
                raise RunProblem("cannot_cancel", f"interrupt {row.interrupt_id!r} has no deadline, so no "
                                 "default answer to cancel it with: answer it instead")
            answers.append(Answer(row.interrupt_id, row.default, cancelled=True))
            continue
        if row.response_schema is not None and (wrong := mismatch(row.response_schema, entry.payload)):
            raise RunProblem("invalid_resume", f"the answer to {row.interrupt_id!r} does not match its "
                             f"response schema at {wrong.path}: {wrong.message}")
        answers.append(Answer(row.interrupt_id, entry.payload, cancelled=False))
    return answers
