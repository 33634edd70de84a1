"""What the chaos runs saw happen, kept outside the Redis they kill, restart and fail over.

A Redis that loses writes would also lose any record of a double run or a lost session kept in
it. So every process that witnesses something appends it to a file of its own in one folder
(`CHAOS_RECORDS_DIR`), one JSON object a line, opened O_APPEND and fsynced before it goes on:

- `tools-<pid>.log`, written by the tool bodies (tests/apps/chaos_tools.py): one line per run,
  `{"tool", "key", "token", "pid"}`, before the body returns;
- `driver.log`, written by the chaos driver (tests/chaos/run_chaos.py, `drive`): each input it
  sent and saw acknowledged (`{"kind": "sent", "session", "input", "key", "entry"[, "interrupt_id"]}`),
  each event it read that marks a delivery or a session's progress (`{"kind": "seen", "session",
  "type", "id"}`), and each session's final state (`{"kind": "final", "session", "state"}`).

At the end `Evidence.load` reads the folder and the checks compare it with what Redis says: a
tool body run more often than allowed, a result of its own without a run, an input the driver
saw acknowledged that Redis never applied, an event the driver read that Redis no longer has.
A line cut short by a kill -9 (one `write` of a short line: not expected) is counted, not read.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

DRIVER_FILE = "driver.log"
#: the events the driver writes down when it reads them: each must still be in Redis at the end
SEEN = frozenset({"interrupt.raised", "interrupt.resumed", "tool.completed", "turn.completed",
                  "session.closed"})


class AppendOnly:
    """A file one process appends JSON lines to, each on disk (fsync) before `write` returns."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.pid = os.getpid()
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self.fd, orjson.dumps(record) + b"\n")  # one write of one short line: appended whole
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Evidence:
    """The folder's records, by session."""

    #: (tool, key) -> distinct runs of its body
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: session -> the inputs the driver saw acknowledged, in order
    sent: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    #: session -> the events the driver read (type and id), in order
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    #: session -> its state as the driver left it
    final: dict[str, str] = field(default_factory=dict)
    torn: int = 0
    files: int = 0

    @classmethod
    def load(cls, directory: Path) -> Evidence:
        evidence = cls()
        tokens: dict[tuple[str, str], set[str]] = defaultdict(set)
        for path in sorted(directory.glob("*.log")) if directory.exists() else []:
            evidence.files += 1
            for line in path.read_bytes().splitlines():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    evidence.torn += 1
                    continue
                if "tool" in record:
                    tokens[(record["tool"], record["key"])].add(record["token"])
                elif record["kind"] == "sent":
                    evidence.sent[record["session"]].append(record)
                elif record["kind"] == "seen":
                    evidence.seen[record["session"]].append(record)
                elif record["kind"] == "final":
                    evidence.final[record["session"]] = record["state"]
        evidence.runs = Counter({k: len(v) for k, v in tokens.items()})
        return evidence

    def ran(self, tool: str, key: str) -> int:
        return self.runs[(tool, key)]


def delivery_problems(evidence: Evidence, session: str, events: list[tuple[str, dict[str, Any]]],
                      same_ids: bool = True) -> list[str]:
    """What the driver saw, against the session's events in Redis at the end (id, event).

    Each input it saw acknowledged was applied: its message is there, its resume delivered (or
    the session closed, which a late resume meets), its close done. Each event it read is still
    there: with `same_ids`, by id (a Redis restarted from its AOF keeps every acknowledged
    write); else by type (a failover may lose a transition read before its replica had it: its
    input is then applied again, its events written again with new ids)."""
    problems = []
    types = Counter(e["type"] for _id, e in events)
    closed = types["session.closed"] > 0
    resumed = {e.get("interrupt_id") for _id, e in events if e["type"] == "interrupt.resumed"}
    users = sum(e["type"] == "message.created" and e.get("message", {}).get("role") == "user"
                for _id, e in events)
    for sent in evidence.sent.get(session, []):
        kind = sent["input"]
        if kind == "message.create" and not users:
            problems.append(f"its message (entry {sent['entry']}) acknowledged, never applied")
        elif kind == "interrupt.resume" and sent.get("interrupt_id") not in resumed and not closed:
            problems.append(f"its resume of {sent.get('interrupt_id')} (entry {sent['entry']}) "
                            "acknowledged, never delivered")
        elif kind == "session.close" and not closed:
            problems.append(f"its close (entry {sent['entry']}) acknowledged, never applied")
    seen = evidence.seen.get(session, [])
    if same_ids:
        ids = {i for i, _e in events}
        gone = [f"{s['type']} {s['id']}" for s in seen if s["id"] not in ids]
    else:
        gone = sorted({s["type"] for s in seen if not types[s["type"]]})
    if gone:
        problems.append(f"events the driver read are gone from Redis: {gone}")
    return problems
