"""parley.runtime.retry.backoff: the one delay computation of every retry loop (no I/O)."""

import random

import pytest

from parley.runtime.retry import backoff


def test_doubles_from_the_base_up_to_the_cap() -> None:
    # the dispatcher's and the workers' outage waits: 0.1 s, doubling, at most 5 s
    assert [backoff(n, base=0.1, cap=5.0) for n in range(8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])


def test_the_cli_worker_restart_schedule() -> None:
    # `parley worker` restarting RQ's loop: 0.5, 1, 2, 4, then 5 s (restarts counted from 1)
    assert [backoff(n, base=0.25, cap=5.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_growth_other_than_two() -> None:
    # RQ's exponential_backoff_factor, used by the worker's dequeue loop
    assert [backoff(n, base=1.0, cap=60.0, growth=3.0) for n in range(5)] == [1.0, 3.0, 9.0, 27.0, 60.0]


def test_a_long_outage_never_overflows() -> None:
    assert backoff(10_000, base=0.1, cap=5.0) == 5.0
    assert backoff(10_000, base=0.5, cap=10.0, jitter=True) <= 10.0


def test_jitter_is_full_jitter_under_the_same_ceiling() -> None:
    random.seed(7)
    for attempt in range(6):
        ceiling = min(3.0, 0.5 * 2 ** attempt)
        delays = [backoff(attempt, base=0.5, cap=3.0, jitter=True) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2 and min(delays) < ceiling / 2  # spread over the range


def test_zero_base_or_cap_means_no_wait() -> None:
    assert backoff(3, base=0.0, cap=5.0) == 0.0
    assert backoff(3, base=1.0, cap=0.0, jitter=True) == 0.0


def test_a_negative_attempt_is_a_bug() -> None:
    with pytest.raises(ValueError):
        backoff(-1, base=0.1, cap=5.0)


def test_every_retry_loop_of_the_fleet_is_jittered() -> None:
    """After a failover every process of a shard waits out the same outage: a loop that backs
    off in lockstep with the others would hit the new primary all at once. Each call of
    `backoff` in the shipped code passes jitter=True."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    calls = []
    for folder in ("parley", "dispatcher", "workers", "schemas"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if root in p.parents):
                continue  # parley/dispatcher etc. are links to the top-level folders
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "backoff":
                    jittered = any(k.arg == "jitter" and isinstance(k.value, ast.Constant)
                                   and k.value.value is True for k in node.keywords)
                    calls.append((f"{path.relative_to(root)}:{node.lineno}", jittered))
    assert len(calls) >= 10, calls  # the scan found the loops
    assert [where for where, jittered in calls if not jittered] == []
