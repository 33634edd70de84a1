"""What a transition is given besides the session: the time, the app's shape, the limits.

The core never reads a clock or imports an app: the dispatcher passes both in here, so a
transition is a function of its arguments (and a unit test sets the time it wants).
"""

from dataclasses import dataclass, field

from parley.dispatcher.core.admission import AdmissionLimits
from parley.schemas.approvals import ApprovalPolicy


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """How the dispatcher treats one of the app's tools (docs/protocol.md, "Tools")."""

    #: settled by a client's tool.result input, not run by a worker
    deferred: bool = False
    #: safe to run again after its worker died (otherwise it settles as `worker_lost`)
    idempotent: bool = False
    #: a sub-agent: the app spec whose child session runs the call
    agent: str | None = None
    #: this tool's own time limit (else `Limits.tool_timeout_s`)
    timeout_s: float | None = None
    #: the call runs only once an allowed principal approved it (`fn.needs_approval`)
    approval: ApprovalPolicy | None = None


@dataclass(frozen=True, slots=True)
class AppInfo:
    """What the dispatcher needs to know of the app: never its code, only its shape."""

    has_decide: bool = False
    #: the trigger types `decide` is asked about (None: all of them)
    decide_on: frozenset[str] | None = None
    tools: dict[str, ToolInfo] = field(default_factory=dict)

    def needs_decide(self, trigger_type: str) -> bool:
        """Whether a trigger goes to a decide job; if not, its proposed actions are applied."""
        if not self.has_decide:
            return False
        return self.decide_on is None or trigger_type in self.decide_on


@dataclass(frozen=True, slots=True)
class Limits:
    """Time limits of the jobs the dispatcher enqueues, in seconds."""

    decide_timeout_s: float = 30
    llm_timeout_s: float = 120
    tool_timeout_s: float = 300
    #: a sub-agent call's limit, from its spawn to its child's report (unless the tool sets
    #: fn.timeout_s): a parent's turn never waits forever for a child
    subagent_timeout_s: float = 3600


#: how long a closed session's keys stay before the expiry sweep deletes them (7 days)
DEFAULT_RETENTION_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """When a session's keys leave Redis (docs/operations.md, "Retention and archive")."""

    #: a closed session is deleted this long after its close (0: at the next expiry sweep)
    retention_ms: int = DEFAULT_RETENTION_S * 1000
    #: an open session this long without a transition is closed (reason `idle`); None: never
    idle_timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a transition reads besides the session's own state."""

    now_ms: int
    app: AppInfo
    #: where this session's jobs post their outcomes (its partition's results stream)
    results_stream: str = "parley:results"
    limits: Limits = Limits()
    lifecycle: Lifecycle = Lifecycle()
    #: what one session may hold (docs/protocol.md, "Limits"), checked again as inputs apply
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    #: sub-agent apps by their spec (`fn.agent`), for child sessions
    agents: dict[str, AppInfo] = field(default_factory=dict)
    #: whether the dispatcher exports traces (docs/tracing.md): turns without a producer's trace
    #: context then get one derived from the session and the turn
    tracing: bool = False
