"""The replica-acknowledgement rule (--replica-acks), without Redis."""

import pytest

from parley.dispatcher.replicas import ReplicaPolicy, confirmed
from parley.runtime.replicas import take_confirmed


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


def test_a_take_is_confirmed_only_by_a_wait_on_the_server_that_made_it() -> None:
    policy = ReplicaPolicy(acks=1, timeout_ms=100)
    assert take_confirmed(policy, "run-a", "run-a", 1)
    assert take_confirmed(policy, "run-a", "run-a", 2)
    assert not take_confirmed(policy, "run-a", "run-a", 0)  # replicas behind
    # after a reconnect: the promoted replica (or the same address restarted) answered the WAIT;
    # its replicas hold its own writes, which need not include the take
    assert not take_confirmed(policy, "run-a", "run-b", 1)
    assert not take_confirmed(policy, "", "", 1)  # a take that named no server proves nothing
    assert not take_confirmed(policy, "", "run-b", 1)


def test_without_replica_acks_a_take_needs_no_confirmation() -> None:
    assert take_confirmed(ReplicaPolicy(), "", "", 0)
