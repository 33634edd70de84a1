"""A Sentinel-managed Redis for failover tests: one primary, one replica, three sentinels.

All on loopback, free ports, one temporary folder. The sentinels are `redis-server <conf>
--sentinel`: Debian's `redis-sentinel` is the same program under another name, so nothing
beyond redis-server needs installing. Failover is quick on purpose (`down-after-milliseconds`
1000): a killed primary is replaced within a few seconds.

`ReplicaSet(directory, deployed=True)` runs it as a deployment would (tests/deployed.py): every
node with the shipped redis.conf and users.acl, each replica linked to its primary under the
`parley-replica` login (`masteruser`/`masterauth`, set on every node: any of them may become a
replica), each sentinel watching under `parley-sentinel` (`sentinel auth-user`/`auth-pass`).
Its `url` is then the harness admin's; `url_as(login)` any shipped login's. Without it, the
nodes run with no ACL file and no persistence, as before.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from parley.runtime.procs import RedisServer, free_port

SERVICE = "m"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
# a replica's first sync starts at once (Redis waits 5 s by default for more replicas to come)
FAST_SYNC = {"repl-diskless-sync-delay": "0"}


@dataclass
class Sentinel:
    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    #: (user, password) the sentinel authenticates to the nodes with (None: no ACL)
    auth: tuple[str, str] | None = None

    def start(self, primary_port: int) -> Sentinel:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"  # a sentinel rewrites its own config: a file of its own
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
                        f"logfile {self.directory / 'sentinel.log'}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                        f"sentinel parallel-syncs {SERVICE} 1\n"
                        + (f"sentinel auth-user {SERVICE} {self.auth[0]}\n"
                           f"sentinel auth-pass {SERVICE} {self.auth[1]}\n" if self.auth else ""))
        self.proc = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis sentinel did not start on port {self.port}") from None
                time.sleep(0.02)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class ReplicaSet:
    """A primary, a replica of it, and three sentinels watching them (quorum 2)."""

    directory: Path
    servers: list[RedisServer] = field(default_factory=list)
    sentinels: list[Sentinel] = field(default_factory=list)
    #: as deployed: the shipped redis.conf and users.acl on every node, ACL'd links (above)
    deployed: bool = False

    def _node(self, name: str, settings: dict[str, str]) -> RedisServer:
        if not self.deployed:
            return RedisServer(self.directory / name, settings=settings)
        from tests.deployed import REPLICA, deployed_redis, login

        user, password = login(REPLICA).split(":", 1)
        return deployed_redis(self.directory / name,
                              settings={**settings, "masteruser": user, "masterauth": password})

    def start(self) -> ReplicaSet:
        primary = self._node("a", dict(FAST_SYNC)).start()
        replica = self._node("b", {**FAST_SYNC, "replicaof": f"127.0.0.1 {primary.port}"}).start()
        self.servers = [primary, replica]
        self.wait_replicas(primary, 1)
        auth = None
        if self.deployed:
            from tests.deployed import SENTINEL, login

            user, password = login(SENTINEL).split(":", 1)
            auth = (user, password)
        self.sentinels = [Sentinel(self.directory / f"sentinel-{i}", auth=auth).start(primary.port)
                          for i in range(3)]
        # every sentinel knows the replica and the other sentinels before anything may fail
        deadline = time.monotonic() + 20
        while not all(self._sees_all(s) for s in self.sentinels):
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not discover each other and the replica")
            time.sleep(0.1)
        return self

    def _sees_all(self, s: Sentinel) -> bool:
        c = redis.Redis(host="127.0.0.1", port=s.port, decode_responses=True)
        try:
            info = c.execute_command("SENTINEL", "MASTER", SERVICE)
            fields = dict(zip(info[::2], info[1::2], strict=True)) if isinstance(info, list) else info
            return int(fields["num-slaves"]) >= 1 and int(fields["num-other-sentinels"]) >= 2
        finally:
            c.close()

    @property
    def url(self) -> str:
        """The Sentinel URL (as deployed: the harness admin's login, that of the nodes' `url`)."""
        return self.url_as(self.servers[0].login if self.servers else None)

    def url_as(self, login: str | None) -> str:
        """The Sentinel URL with `login` ("user:password", the primary's; None: none)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{login + '@' if login else ''}{hosts}/{SERVICE}/0"

    def critical_lines(self) -> list[str]:
        """Every node's `== CRITICAL ==` log lines (RedisServer.critical_lines), each with its node."""
        return [f"{server.directory.name}: {line}"
                for server in self.servers for line in server.critical_lines()]

    def primary_port(self) -> int:
        """The primary as the sentinels name it now."""
        for s in self.sentinels:
            c = redis.Redis(host="127.0.0.1", port=s.port, decode_responses=True)
            try:
                addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
                return int(addr[1])
            except redis.ConnectionError:
                continue
            finally:
                c.close()
        raise RuntimeError("no sentinel answers")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def kill_primary(self) -> RedisServer:
        """kill -9 the primary; returns it (stopped)."""
        primary = self.server(self.primary_port())
        primary.stop(kill=True)
        return primary

    def kill_primary_behind(self, lag_s: float = 0.5) -> RedisServer:
        """A failover that loses what was not replicated: the replicas are held still
        (SIGSTOP) and cut off (CLIENT KILL TYPE replica on the primary), the primary takes
        `lag_s` of writes no replica holds, is killed -9, and the replicas are let go (SIGCONT)
        for the sentinels to promote one. (Replication on loopback takes well under a
        millisecond: a kill at a random moment would lose nothing. SIGSTOP alone is not enough
        either: what the primary sends meanwhile waits in the stopped replica's socket buffer,
        and is read when it resumes; cut off, nothing more is sent, and held still, it cannot
        reconnect before the primary is gone.) Returns the old primary (stopped)."""
        primary = self.server(self.primary_port())
        held = [s for s in self.servers if s is not primary and s.proc is not None and s.proc.poll() is None]
        for s in held:
            assert s.proc is not None
            os.kill(s.proc.pid, signal.SIGSTOP)
        try:
            admin = redis.Redis.from_url(primary.url)
            try:
                admin.client_kill_filter(_type="replica")
            finally:
                admin.close()
            time.sleep(lag_s)
            primary.stop(kill=True)
        finally:
            for s in held:
                assert s.proc is not None
                os.kill(s.proc.pid, signal.SIGCONT)
        return primary

    def wait_promoted(self, old: RedisServer, within_s: float = 30) -> RedisServer:
        """Until the sentinels name another primary than `old`, and it answers as one."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port != old.port:
                c = redis.Redis.from_url(self.server(port).url)
                try:
                    if c.info("replication")["role"] == "master":
                        return self.server(port)
                except redis.ConnectionError:
                    pass
                finally:
                    c.close()
            time.sleep(0.1)
        raise RuntimeError("no replica was promoted")

    def rejoin(self, old: RedisServer, primary: RedisServer, within_s: float = 30) -> None:
        """Start `old` again (empty: no persistence); the sentinels turn it into a replica of the
        new primary. Returns once the primary has it as a synced replica.

        With `replica-priority 0` the sentinels never promote it: back empty, it would lose every
        write were they to fail over again before it synced (a loaded machine can keep the new
        primary from answering for `down-after-milliseconds`; a chaos run once saw exactly that)."""
        self.wait_all_name(primary, within_s)
        old.settings["replica-priority"] = "0"
        # Started as the new primary's replica, never as a master: back empty, a master would be
        # a candidate for a sentinel whose view is a step behind, which may fail over to it and
        # wipe the shard (a chaos run on a loaded machine once saw exactly that).
        old.settings["replicaof"] = f"127.0.0.1 {primary.port}"
        old.start()
        self.wait_replicas(primary, 1, within_s)

    def wait_all_name(self, primary: RedisServer, within_s: float = 30) -> None:
        """Until every sentinel names `primary` as the primary (the failover has converged)."""
        deadline = time.monotonic() + within_s
        while True:
            named = set()
            for s in self.sentinels:
                c = redis.Redis(host="127.0.0.1", port=s.port, decode_responses=True)
                try:
                    named.add(int(c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1]))
                except redis.ConnectionError:
                    named.add(-1)
                finally:
                    c.close()
            if named == {primary.port}:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels name {sorted(named)}, not {primary.port}")
            time.sleep(0.1)

    @staticmethod
    def wait_replicas(primary: RedisServer, n: int, within_s: float = 30) -> None:
        c = redis.Redis.from_url(primary.url)
        deadline = time.monotonic() + within_s
        try:
            while True:
                info = c.info("replication")
                online = [v for k, v in info.items()
                          if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"]
                if len(online) >= n:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{primary.url}: {len(online)} of {n} replicas online")
                time.sleep(0.1)
        finally:
            c.close()

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for server in self.servers:
            server.stop()
