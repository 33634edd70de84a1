"""The session state machine: (state, input or work outcome, context) -> Transition. PURE.

No Redis, no clock, no randomness: every rule of docs/rules.md (I1-I13) lives here and is
unit-tested without I/O; the shell (`dispatcher.entries`, `dispatcher.apply`,
`dispatcher.store`, `dispatcher.enqueue`) loads the state, commits what this returns and
does its effects.

By concern: `inputs` and `outcomes` route each input type and outcome kind to one handler;
`decisions` (one trigger at a time, validate then apply), `triggers` (fire, hold,
release), `work` (model calls, tools, sub-agents), `interrupts` (raise, park, resume),
`budgets` (I3), `turns` (the end of every transition); `transition` is the working copy
they share, `effects` what a transition asks the shell to do, `context` what it is given.

Vocabulary (docs/protocol.md): a *turn* is the work after one client message; it is named
by that message's id and its *tip* is the last message it appended. A branch is *parked*
when its head is an open interrupt's anchor or below one (or a global interrupt is open).
"""

from parley.dispatcher.core.admission import AdmissionLimits
from parley.dispatcher.core.context import AppInfo, Context, Lifecycle, Limits, ToolInfo
from parley.dispatcher.core.decisions import InvalidDecision
from parley.dispatcher.core.effects import (
    Cancel,
    Close,
    DeadlineAdd,
    DeadlineRemove,
    Effect,
    Enqueue,
    Idle,
    IndexAdd,
    IndexRemove,
    Listing,
    Report,
    Retire,
    Spawn,
    Stat,
    effect_from_dict,
    effect_to_dict,
    effect_to_json,
)
from parley.dispatcher.core.inputs import apply_input
from parley.dispatcher.core.outcomes import apply_outcome
from parley.dispatcher.core.transition import Transition
from parley.dispatcher.core.work import MAX_ATTEMPTS

__all__ = [
    "MAX_ATTEMPTS",
    "AdmissionLimits",
    "AppInfo",
    "Cancel",
    "Close",
    "Context",
    "DeadlineAdd",
    "DeadlineRemove",
    "Effect",
    "Enqueue",
    "Idle",
    "IndexAdd",
    "IndexRemove",
    "InvalidDecision",
    "Lifecycle",
    "Limits",
    "Listing",
    "Report",
    "Retire",
    "Spawn",
    "Stat",
    "ToolInfo",
    "Transition",
    "apply_input",
    "apply_outcome",
    "effect_from_dict",
    "effect_to_dict",
    "effect_to_json",
]
