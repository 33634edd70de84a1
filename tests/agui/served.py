"""`parley agui` as a process for the tests, and a Python reader of its runs that checks every
event with the AG-UI SDK's own models (ag_ui.core), so that nothing the endpoint writes is
taken on our word."""

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from ag_ui.core import Event
from pydantic import TypeAdapter

from tests import npm

EVENT: TypeAdapter[Any] = TypeAdapter(Event)


@dataclass
class Endpoint:
    url: str
    token: str | None = None

    def run(self, body: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
        """POST one run; its events, each validated as an AG-UI event."""
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        events: list[dict[str, Any]] = []
        with httpx.stream("POST", self.url, json=body, headers=headers, timeout=timeout) as reply:
            assert reply.status_code == 200, reply.read()
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: "):])
                    EVENT.validate_python(event)  # the SDK's own model of it
                    events.append(event)
        return events


def wait_serving(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not serve within {timeout}s")


JS = Path(__file__).parent / "js"


def js_client() -> Path:
    """tests/agui/js with the real `@ag-ui/client` installed (pinned by its package-lock.json),
    installed once for all test processes."""
    return npm.installed(JS, "@ag-ui/client")


def drive(url: str, token: str, thread: str) -> dict[str, Any]:
    """tests/agui/js/drive.mjs against the endpoint: what each of its three runs gave the client."""
    done = subprocess.run(["node", "drive.mjs", url, token, thread], cwd=js_client(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
