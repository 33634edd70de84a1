"""A private Redis plus Parley dispatchers and workers as real processes, for one measurement.

Every measurement starts a fresh fleet (new redis-server, new data directory, new processes),
so memory figures and counters start from zero and no run warms the next one's caches.
"""

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from parley.runtime.procs import RedisServer, free_port, start_parley, stop_process
from parley.schemas.keys import Keys

APP = "examples.seed_app"


class FleetError(RuntimeError):
    pass


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process, in KiB (None once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float | None:
    """User + system CPU time of a process, in seconds (None once it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU time spent by everything on the machine (all cores; /proc/stat minus idle and iowait)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(parts[:8]) - parts[3] - parts[4]) / CLK_TCK


def scrape(port: int) -> dict[str, float]:
    """A process's /metrics, flattened to `name{label="v",...}` -> value (counters and gauges)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def metric_sum(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.popen.pid


# The data-structure settings of deploy/redis/redis.conf (what a user following deploy/ runs);
# the fsync policy is each row's own.
TUNING = ("stream-node-max-bytes", "hash-max-listpack-value")
DEPLOY_REDIS_CONF = Path(__file__).resolve().parent.parent / "deploy" / "redis" / "redis.conf"


def deploy_tuning() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in DEPLOY_REDIS_CONF.read_text().splitlines():
        name, _, value = line.strip().partition(" ")
        if name in TUNING:
            found[name] = value.strip()
    return found


@dataclass
class Fleet:
    workdir: Path
    appendfsync: str = "always"
    dispatchers: int = 1
    workers: int = 1
    partitions: int = 1
    app: str = APP
    lease_ms: int = 10_000
    server: RedisServer | None = None
    redis: Any = None
    keys: Keys = field(default_factory=Keys)
    procs: list[Proc] = field(default_factory=list)
    balance_s: float | None = None  # seconds from starting the dispatchers to shared partitions
    #: more flags for every dispatcher (the soak's --retention, --idle-timeout, ...)
    dispatcher_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def env(self) -> dict[str, str]:
        return {"PARLEY_REDIS_URL": self.url, "PARLEY_APP": self.app, "PARLEY_LOG_LEVEL": "WARNING"}

    def dispatcher_procs(self) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith("dispatcher")]

    def worker_procs(self) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith("worker")]

    # ---- start ------------------------------------------------------------------------------

    def start(self) -> "Fleet":
        if self.dispatchers > self.partitions:
            raise FleetError("more dispatchers than partitions: the extra ones would only stand by")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.server = RedisServer(self.workdir / "redis", appendonly=True, appendfsync=self.appendfsync,
                                  settings=deploy_tuning()).start()
        self.redis = redis.Redis.from_url(self.url)
        # Publish N before any dispatcher starts (they only HSETNX their own default).
        self.redis.hset(self.keys.config, "partitions", self.partitions)
        try:
            self._start_dispatchers()
            for i in range(self.workers):
                self._spawn(f"worker-{i}", ["worker"])
            self._wait(lambda: self.redis.scard("rq:workers") >= self.workers, "workers registering")
            for p in self.procs:
                self._wait(lambda p=p: self._answers(p.metrics_port), f"{p.name} serving /metrics")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, args: list[str]) -> Proc:
        port = free_port()
        popen = start_parley([*args, "--metrics-port", str(port)], self.env, self.workdir / f"{name}.log")
        proc = Proc(name, popen, port)
        self.procs.append(proc)
        return proc

    def _lease_holder(self, n: int) -> str | None:
        raw = self.redis.get(self.keys.lease(n))
        return raw.decode() if raw else None

    def _start_dispatchers(self) -> None:
        """Start the dispatchers, then wait until the partitions are shared: Parley's dispatchers
        register in `parley:dispatchers` and each holds about ceil(N / live dispatchers) leases,
        giving back extras between batches (every third of a lease period)."""
        args = ["dispatcher", "--partitions", str(self.partitions), "--lease-ms", str(self.lease_ms),
                *self.dispatcher_args]
        for i in range(self.dispatchers):
            self._spawn(f"dispatcher-{i}", args)
        share = -(-self.partitions // self.dispatchers)
        started = time.monotonic()

        def balanced() -> bool:
            holders = [self._lease_holder(n) for n in range(self.partitions)]
            if any(h is None for h in holders):
                return False
            counts: dict[str, int] = {}
            for h in holders:
                name = str(h).rsplit(":", 1)[0]  # the token is "<dispatcher name>:<random>"
                counts[name] = counts.get(name, 0) + 1
            return len(counts) == min(self.dispatchers, self.partitions) and max(counts.values()) <= share

        self._wait(balanced, "the dispatchers sharing the partitions",
                   timeout=max(30, 3 * self.lease_ms / 1000))
        self.balance_s = round(time.monotonic() - started, 2)

    @staticmethod
    def _answers(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    def _wait(self, ok: Any, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            dead = [p.name for p in self.procs if p.popen.poll() is not None]
            if dead:
                raise FleetError(f"{', '.join(dead)} exited while {what}; logs in {self.workdir}")
            if time.monotonic() > deadline:
                raise FleetError(f"timed out {what}; logs in {self.workdir}")
            time.sleep(0.05)

    # ---- observe ----------------------------------------------------------------------------

    def check_alive(self) -> None:
        dead = [f"{p.name} (exit {p.popen.returncode})" for p in self.procs if p.popen.poll() is not None]
        if dead:
            raise FleetError(f"{', '.join(dead)} died; logs in {self.workdir}")

    def counters(self) -> dict[str, float]:
        """Fleet-wide sums of the counters the report uses."""
        jobs: dict[str, float] = {}
        for p in self.worker_procs():
            m = scrape(p.metrics_port)
            for kind in ("decide", "llm", "tool"):
                for outcome in ("ok", "error"):
                    key = f'parley_jobs_total{{kind="{kind}",outcome="{outcome}"}}'
                    jobs[f"jobs_{kind}_{outcome}"] = jobs.get(f"jobs_{kind}_{outcome}", 0) + m.get(key, 0)
        transitions = sum(metric_sum(scrape(p.metrics_port), "parley_transitions_total")
                          for p in self.dispatcher_procs())
        jobs["jobs"] = sum(v for k, v in jobs.items() if k.startswith("jobs_"))
        jobs["transitions"] = transitions
        return jobs

    def cpu(self) -> dict[str, float | None]:
        """CPU seconds so far of each process of the fleet, of redis-server and of this driver,
        and of the whole machine (`machine`), to tell what a measurement cost and what else ran."""
        out = {p.name: cpu_seconds(p.pid) for p in self.procs}
        if self.server is not None and self.server.proc is not None:
            out["redis"] = cpu_seconds(self.server.proc.pid)
        out["driver"] = cpu_seconds()
        out["machine"] = machine_busy_seconds()
        return out

    def rss(self) -> dict[str, int | None]:
        return {p.name: rss_kib(p.pid) for p in self.procs}

    def quiesce(self, timeout: float = 60) -> None:
        """Until the queues are empty, every stream entry is acknowledged and no job runs."""
        n = self.partitions
        streams = [self.keys.inputs(p, n) for p in range(n)] + [self.keys.results(p, n) for p in range(n)]

        def idle() -> bool:
            pipe = self.redis.pipeline(transaction=False)
            for q in ("decide", "llm", "tools"):
                pipe.llen(f"rq:queue:{self.keys.queue(q)}")
            pipe.hlen(self.keys.running)
            for s in streams:
                pipe.xlen(s)
            return not any(pipe.execute())

        deadline = time.monotonic() + timeout
        while not idle():
            self.check_alive()
            if time.monotonic() > deadline:
                raise FleetError(f"the fleet did not go idle within {timeout}s; logs in {self.workdir}")
            time.sleep(0.05)

    # ---- stop -------------------------------------------------------------------------------

    def stop_parley(self) -> None:
        """Stop the dispatchers and workers (SIGTERM, then SIGKILL after 10 s); Redis stays up."""
        for p in self.procs:
            stop_process(p.popen)
        self.procs.clear()

    def stop(self) -> None:
        self.stop_parley()
        if self.redis is not None:
            self.redis.close()
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
