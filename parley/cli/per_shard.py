"""One process per shard: what `parley dispatcher` / `parley worker` do when given several
Redis URLs and no `--shard` (docs/operations.md, "Processes per shard").

Each shard's processes connect to that shard only, so a command serving a deployment of S
shards starts S children (`python -m parley`, the same arguments plus `--shard i`), passes
SIGTERM and SIGINT on to them, and exits once they all have: 0 if they all did, else 1.
`--metrics-port P` becomes P+i for child i, so each child serves its own /metrics.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from parley.schemas.shards import Placement, PlacementError

METRICS_OPTION = "--metrics-port"


def child_args(argv: Sequence[str], shard: int, metrics_port: int | None) -> list[str]:
    """The command line of child `shard`: `argv` (this process's arguments, after the program)
    without its `--metrics-port`, plus `--shard` and the child's own metrics port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == METRICS_OPTION:
            skip = True  # its value follows
            continue
        if arg.startswith(METRICS_OPTION + "="):
            continue
        out.append(arg)
    out += ["--shard", str(shard)]
    if metrics_port is not None:
        out += [METRICS_OPTION, str(metrics_port + shard)]
    return out


def run_per_shard(shards: int, metrics_port: int | None, argv: Sequence[str] | None = None) -> int:
    """Start a child per shard, forward SIGTERM/SIGINT to them, wait for all; the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    children: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # installed first: a signal while the children start must not leave any of them orphaned
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for i in range(shards):
        child = subprocess.Popen([sys.executable, "-m", "parley", *child_args(args, i, metrics_port)])
        children.append(child)
        if stopping:  # asked to stop before this one started
            child.send_signal(stopping[0])
    codes = [child.wait() for child in children]
    return 0 if all(code == 0 for code in codes) else 1


def await_placement(check: Callable[[], Placement | None], wait_s: float,
                    sleep: Callable[[float], None] = time.sleep, step_s: float = 0.5) -> Placement:
    """The placement a worker serves by: `check()` (the shards' agreed placement, PlacementError
    when they disagree) until one is there. A worker may start before any dispatcher has
    written the first placement, so it waits up to `wait_s`, then refuses."""
    deadline = time.monotonic() + wait_s
    while True:
        placement = check()
        if placement is not None:
            return placement
        if time.monotonic() >= deadline:
            raise PlacementError(f"no shard holds a placement after {wait_s:g} s: start a dispatcher "
                                 "of this deployment first (it writes the placement)")
        sleep(step_s)
