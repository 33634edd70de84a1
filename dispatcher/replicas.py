"""The dispatcher's replica acknowledgements (`--replica-acks`): the shell lives on the ops
floor, in parley/runtime/replicas.py, since workers use it too; these are its names, here as well."""

from parley.runtime.replicas import (
    DEFAULT_REPLICA_ACK_TIMEOUT_MS,
    WAITS_FIELD,
    ReplicaPolicy,
    Replicas,
    ReplicasBehind,
    confirmed,
)

__all__ = ["DEFAULT_REPLICA_ACK_TIMEOUT_MS", "WAITS_FIELD", "ReplicaPolicy", "Replicas", "ReplicasBehind",
           "confirmed"]
