"""The worker's own heartbeat: `parley:worker:<id>`, kept alive from a thread."""

import logging
import threading

from parley.runtime.metrics import Health

log = logging.getLogger("parley.worker")


class Heartbeat(threading.Thread):
    """Keeps `parley:worker:<id>` alive while this process lives, so that a dispatcher
    notices within seconds when a worker dies holding a job (RQ notices much later)."""

    INTERVAL_S = 1.0
    TTL_MS = 5000

    def __init__(self, connection, key: str, health: Health | None = None):  # type: ignore[no-untyped-def]
        super().__init__(name="parley-heartbeat", daemon=True)
        self.connection = connection
        self.key = key
        self.health = health
        self.stopped = threading.Event()

    def beat(self) -> None:
        self.connection.set(self.key, 1, px=self.TTL_MS)
        if self.health is not None:
            self.health.beat()

    def run(self) -> None:
        while not self.stopped.wait(self.INTERVAL_S):
            try:
                self.beat()
            except Exception as exc:  # Redis away: keep trying; the worker itself reconnects
                log.warning("heartbeat failed", extra={"kv": {"error": repr(exc)}})

    def stop(self) -> None:
        self.stopped.set()
        try:
            self.connection.delete(self.key)
        except Exception:
            log.warning("could not clear the heartbeat on exit")
