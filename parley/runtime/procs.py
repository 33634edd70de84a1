"""Start and stop local processes: a private redis-server (demo, tests) and Parley's own."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A private redis-server on a free port, its data in `directory`."""

    directory: Path
    port: int = field(default_factory=free_port)
    appendonly: bool = False
    appendfsync: str = "always"
    # more `redis.conf` directives, e.g. {"stream-node-max-bytes": "1024"}
    settings: dict[str, str] = field(default_factory=dict)
    # a redis.conf read first (the options above override it), e.g. deploy/redis/redis.conf
    config_file: Path | None = None
    # an ACL file (`--aclfile`); then `login` ("user:password") is the one `url` carries
    aclfile: Path | None = None
    login: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_as(self.login)

    def url_as(self, login: str | None) -> str:
        """The URL of this server for `login` ("user:password"; None: no credentials)."""
        return f"redis://{login + '@' if login else ''}127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def critical_lines(self) -> list[str]:
        """The `== CRITICAL ==` lines of this server's log, e.g. a transaction its AOF's replay
        skipped: none is expected of a healthy server."""
        if not self.log_path.exists():
            return []
        return [line for line in self.log_path.read_text(errors="replace").splitlines()
                if "CRITICAL" in line]

    def start(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [binary, *([str(self.config_file)] if self.config_file else []),
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync, "--logfile", str(self.log_path)]
        if self.aclfile is not None:
            args += ["--aclfile", str(self.aclfile)]
        for name, value in self.settings.items():
            args += [f"--{name}", value]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                # AOF loading answers LOADING: wait until the data is all there.
                client.ping()
                if client.info("persistence").get("loading", 0) == 0:
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
                raise RuntimeError(f"redis-server did not start on port {self.port}\n{tail}")
            time.sleep(0.02)
        client.close()
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def parley_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "parley", *args]


def start_parley(args: list[str], env: dict[str, str], log_path: Path | None = None
                 ) -> subprocess.Popen[bytes]:
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    return subprocess.Popen(parley_command(*args), env={**os.environ, **env}, stdout=out,
                            stderr=subprocess.STDOUT)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> int:
    return stop_processes([proc], timeout)[0]


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 10) -> list[int]:
    """SIGTERM to every process at once, then each awaited (killed past `timeout`): a graceful
    stop waits out a blocking read (a worker's BLPOP, a dispatcher's XREADGROUP), so stopping a
    fleet takes about the longest of those, not their sum. Exit codes in `procs`' order."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]
