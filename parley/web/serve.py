"""The inbox's HTTP server: uvicorn, stopping as a service should."""

from types import FrameType

import uvicorn


class StoppingServer(uvicorn.Server):
    """uvicorn's server, but a SIGTERM or SIGINT is a normal stop: the process exits 0 after the
    graceful shutdown. (uvicorn raises the signal again once it is done, so every orderly stop
    would look like a crash to a supervisor or an orchestrator.)"""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()
