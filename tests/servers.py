"""Private PostgreSQL and Redis servers for fault tests: started by the test on a free port in a
temporary directory, stopped and started again at will, removed afterwards. The machine's
shared servers are never touched.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server binaries installed (Debian's layout), if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parts[-3])
    except ValueError:
        return 0.0


class PrivatePostgres:
    """A throw-away PostgreSQL cluster (trust auth, no fsync). As root, it runs as the
    ``postgres`` user, since PostgreSQL refuses to run as root."""

    def __init__(self, bindir: Path, database: str = "akri") -> None:
        self.bindir = bindir
        self.database = database
        self.dir = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self._as, str(self.bindir / tool), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def create(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        self.start()
        self._run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.database
        )
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # not running
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A throw-away ``redis-server`` on a free port, without persistence."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rd", dir="/tmp"))
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.dir)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.answers, 10, "the private redis-server")
        return self

    def answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
