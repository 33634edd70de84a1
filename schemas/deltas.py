"""Token streaming (docs/protocol.md, "Token streaming"): a model call's text as it is generated.

While a model call runs, the worker appends what the model has written so far, in pieces, to
the session's deltas stream `parley:{S}:deltas`, beside its durable events. That stream is for
watching only: capped (about `MAXLEN` entries), and gone `TTL_S` after its last write. The
reply itself is recorded once, whole, by the durable `message.created` event when the call's
outcome is applied: a call whose worker dies mid-stream leaves pieces here and nothing in the
transcript, and its retry (the next `attempt`) streams again from the start.

An entry is one piece of one attempt of one call: `call` (the `llm-N` of `llm.started`),
`attempt`, `seq` (1, 2, ... within the attempt) and `text`. An entry with `reset` set says
"forget what this attempt streamed so far": the model adapter retried the request (a
connection broke mid-reply) and the text starts again.
"""

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

#: about how many entries a session's deltas stream keeps (XADD MAXLEN ~): a watcher that
#: falls further behind than that misses pieces, never the durable reply
MAXLEN = 1000
#: seconds the stream lives after its last write (EXPIRE): nothing is kept for a parked session
TTL_S = 3600
#: the `type` a delta has among a watcher's events
DELTA_TYPE = "llm.delta"


class Delta(BaseModel):
    """One piece of a model call's reply, as `Client.watch(..., deltas=True)` yields it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["llm.delta"] = "llm.delta"
    #: the model call (`llm-N`, as on `llm.started` / `llm.completed`)
    call_id: str
    #: the job's attempt: a call retried after its worker was lost streams again as attempt 2
    attempt: int
    #: 1, 2, ... within (call_id, attempt)
    seq: int
    text: str
    #: the adapter started the reply again: drop this attempt's text received so far
    reset: bool = False


def entry_fields(delta: Delta) -> dict[str, str]:
    """The stream entry's fields (flat strings: no JSON to parse per piece)."""
    fields = {"call": delta.call_id, "attempt": str(delta.attempt), "seq": str(delta.seq), "text": delta.text}
    if delta.reset:
        fields["reset"] = "1"
    return fields


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def delta_of(fields: Mapping[Any, Any]) -> dict[str, Any] | None:
    """The event dict of a stream entry (`type` llm.delta), None for an entry that is not one
    (written by someone else than a worker: a watcher skips it)."""
    got = {_str(k): _str(v) for k, v in fields.items()}
    try:
        out: dict[str, Any] = {"type": DELTA_TYPE, "call_id": got["call"], "attempt": int(got["attempt"]),
                               "seq": int(got["seq"]), "text": got["text"]}
    except (KeyError, ValueError):
        return None
    if got.get("reset") == "1":
        out["reset"] = True
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def merged(streams: Iterable[tuple[str, list[tuple[Any, Any]]]], count: int
           ) -> tuple[list[tuple[str, str, Any]], dict[str, str]]:
    """Entries of one XREAD over several streams (ids as bytes or str), in the order they were
    written (stream ids are Redis's clock), as (stream, id, fields), and how far each stream was
    taken.

    A stream that returned `count` entries may hold more right after them; an entry of another
    stream written later than its last one must wait for the next read, else it would come out
    ahead of them. So only entries up to the earliest such last id are taken, and each
    stream's position moves to the last entry taken of it (the others are read again)."""
    read = [(name, [(_str(entry_id), fields) for entry_id, fields in entries]) for name, entries in streams]
    full = [_id_key(entries[-1][0]) for _name, entries in read if len(entries) >= count]
    cutoff = min(full) if full else None
    taken: list[tuple[str, str, Any]] = []
    last: dict[str, str] = {}
    for name, entries in read:
        for entry_id, fields in entries:
            if cutoff is not None and _id_key(entry_id) > cutoff:
                break
            taken.append((name, entry_id, fields))
            last[name] = entry_id
    taken.sort(key=lambda item: _id_key(item[1]))
    return taken, last
