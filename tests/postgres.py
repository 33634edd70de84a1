"""A PostgreSQL for tests: the machine's own when one answers, else a private one started here.

The machine's server (127.0.0.1:5432, trust auth, database `test`) is used when it answers;
`PARLEY_TEST_PG_DSN` names another. Otherwise a private server is made with Debian's initdb
and pg_ctl in a temp dir on a free loopback port, and stopped (its files removed) at the end.
Each test gets a schema of its own, dropped after it, so runs never collide.
"""

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from parley.runtime.procs import free_port

DEFAULT_DSN = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3"


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


@dataclass
class PrivatePostgres:
    """initdb + pg_ctl on a temp dir; as root, run as the `postgres` user (initdb refuses root)."""

    directory: Path
    port: int

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres connect_timeout=3"

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    def _binary(self, name: str) -> str:
        found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
        if not found:
            raise RuntimeError(f"no PostgreSQL answers and {name} is not installed "
                               "(Debian: apt-get install postgresql)")
        return found[-1]

    def start(self) -> "PrivatePostgres":
        data = self.directory / "data"
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres")
        self._run(self._binary("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync")
        self._run(self._binary("pg_ctl"), "-D", str(data), "-w", "-l", str(self.directory / "pg.log"),
                  "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -F", "start")
        return self

    def stop(self) -> None:
        try:
            self._run(self._binary("pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def postgres_dsn() -> Iterator[str]:
    """The DSN of a PostgreSQL for this test run."""
    dsn = os.environ.get("PARLEY_TEST_PG_DSN", DEFAULT_DSN)
    if answers(dsn):
        yield dsn
        return
    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="parley-pg-")), free_port()).start()
    try:
        yield server.dsn
    finally:
        server.stop()


@contextmanager
def private_schema(dsn: str) -> Iterator[str]:
    """A new schema, dropped with everything in it afterwards."""
    name = f"parley_test_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
