"""The replica-acknowledgement rule (--replica-acks), without Redis."""

import pytest

from parley.dispatcher.replicas import ReplicaPolicy, confirmed
from parley.runtime.replicas import ServerId, take_confirmed


def test_off_by_default_confirms_whatever_wait_says() -> None:
    assert not ReplicaPolicy().enabled
    assert confirmed(ReplicaPolicy(), 0)


def test_a_batch_is_confirmed_only_by_as_many_replicas_as_asked() -> None:
    policy = ReplicaPolicy(acks=2, timeout_ms=100)
    assert policy.enabled
    assert not confirmed(policy, 0)
    assert not confirmed(policy, 1)
    assert confirmed(policy, 2)
    assert confirmed(policy, 3)  # WAIT may count more replicas than asked


@pytest.mark.parametrize(("acks", "timeout_ms"), [(-1, 100), (1, 0), (1, -5)])
def test_a_policy_out_of_range_is_refused(acks: int, timeout_ms: int) -> None:
    # a timeout of 0 would be WAIT's "block forever": the dispatcher would hang, not back off
    with pytest.raises(ValueError):
        ReplicaPolicy(acks=acks, timeout_ms=timeout_ms)


# ---- a worker's take (issue 29): confirmed only by a WAIT on the server that made it -------------

A, B = ServerId("run-a", "replid-a"), ServerId("run-b", "replid-b")


def test_a_take_is_confirmed_only_by_a_wait_on_the_server_that_made_it() -> None:
    policy = ReplicaPolicy(acks=1, timeout_ms=100)
    assert take_confirmed(policy, A, A, 1)
    assert take_confirmed(policy, A, A, 2)
    assert not take_confirmed(policy, A, A, 0)  # replicas behind
    # after a reconnect: the promoted replica (or the same address restarted) answered the WAIT;
    # its replicas hold its own writes, which need not include the take
    assert not take_confirmed(policy, A, B, 1)
    assert not take_confirmed(policy, ServerId(), ServerId(), 1)  # a take that named no server
    assert not take_confirmed(policy, ServerId(), B, 1)


def test_a_take_is_not_confirmed_by_the_same_process_in_another_replication_history() -> None:
    """The server that made the take was demoted, fully resynced from the new primary (losing
    the take) and promoted again, within redis-py's retries: same run_id, another
    master_replid. Its WAIT counts replicas of writes that do not include the take."""
    policy = ReplicaPolicy(acks=1, timeout_ms=100)
    assert not take_confirmed(policy, A, ServerId("run-a", "replid-a2"), 1)
    assert not take_confirmed(policy, ServerId("run-a", ""), ServerId("run-a", ""), 1)  # half named


def test_without_replica_acks_a_take_needs_no_confirmation() -> None:
    assert take_confirmed(ReplicaPolicy(), ServerId(), ServerId(), 0)
