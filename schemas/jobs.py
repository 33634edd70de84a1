"""The RQ jobs Parley runs: one table, read by the dispatcher's outbox and the worker's allowlist.

The dispatcher's core says only "a job of kind K for work W, attempt A"; the shell
derives the queue, the function RQ imports and the job id from here, and the worker
refuses any job hash naming a function outside this table (docs/design.md, the
allowlist). One table, so the two can never disagree.
"""

import hashlib
from dataclasses import dataclass
from enum import StrEnum


class JobKind(StrEnum):
    """A job's kind; also the `kind` of the outcome it posts (`WorkOutcome.kind`)."""

    #: the app's `decide(trigger, proposed)`
    DECIDE = "decide"
    #: one model call
    LLM = "llm"
    #: one tool call
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class JobSpec:
    #: the RQ queue's name (before `Keys.queue` prefixes it)
    queue: str
    #: the dotted path RQ imports and calls with the job's payload
    func: str


JOBS: dict[JobKind, JobSpec] = {
    JobKind.DECIDE: JobSpec(queue="decide", func="parley.workers.jobs.run_decide"),
    JobKind.LLM: JobSpec(queue="llm", func="parley.workers.jobs.run_llm"),
    JobKind.TOOL: JobSpec(queue="tools", func="parley.workers.jobs.run_tool"),
}

#: The only functions a Parley worker runs.
ALLOWED_FUNCS: frozenset[str] = frozenset(spec.func for spec in JOBS.values())

#: A job kind by the function its job hash names.
KIND_OF_FUNC: dict[str, JobKind] = {spec.func: kind for kind, spec in JOBS.items()}

#: A job kind by its queue's name (outbox records written before the kind was stored).
KIND_OF_QUEUE: dict[str, JobKind] = {spec.queue: kind for kind, spec in JOBS.items()}


def job_id(session: str, work: str, attempt: int) -> str:
    """RQ job ids accept [A-Za-z0-9_-] only; session ids do not, so hash the triple. Each
    attempt is its own job, so a retry never collides with the job it replaces."""
    digest = hashlib.blake2b(f"{session}\x00{work}\x00{attempt}".encode(), digest_size=16)
    return "parley-" + digest.hexdigest()
