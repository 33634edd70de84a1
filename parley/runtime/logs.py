"""key=value logs on stderr: one line per event, with the session and work ids, no payloads."""

import logging
import sys
from typing import Any


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "kv", {})
        parts = [f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}", f"level={record.levelname.lower()}",
                 f"logger={record.name}", f"msg={record.getMessage()!r}"]
        parts += [f"{k}={v}" for k, v in fields.items()]
        if record.exc_info:
            parts.append(f"exc={self.formatException(record.exc_info)!r}")
        return " ".join(parts)


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def kv(**fields: Any) -> dict[str, Any]:
    """`log.info("committed", extra=kv(session=s))`"""
    return {"kv": fields}
