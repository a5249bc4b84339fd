"""Helpers of the opt-in end-to-end suite on the real node (tests/test_real_node.py).

``scripts/real-node`` runs a kubelet, kube-scheduler, kube-controller-manager, kube-proxy,
CoreDNS and containerd of the same release as ``scripts/real-apiserver``'s API server on this
machine. The fast path runs the project's own processes (agent, controller, extender) as host
processes, with the command and environment their manifests in ``deploy/base`` give them; the
deployed path (``DEPLOY_OVERLAY``) applies ``deploy/`` and runs them as pods from the image
``deploy/build-image`` makes. Everything a helper starts it stops, by its own pid.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REAL_NODE = ROOT / "scripts" / "real-node"
REAL_APISERVER = ROOT / "scripts" / "real-apiserver"
PYTHON = sys.executable
AKRI_NAMESPACE = "akri-site"
GROUP, VERSION = "akri.sh", "v0"
BUSYBOX = "localhost/busybox:1"
HOSTS_FILE = Path("/etc/hosts")
EXTENDER_HOST = "akri-site-extender.akri-site.svc"
HOSTS_MARK = "# akri-site tests/test_real_node.py"
# The suite's overlay of deploy/overlays/external (what differs is said in it).
DEPLOY_OVERLAY = ROOT / "tests" / "real-node-deploy"


def log(message: str) -> None:
    print(f"[real-node] {message}", flush=True)


def kube_bin() -> Path:
    found = sorted(
        (ROOT / "var" / "real-apiserver" / "build" / "bin").glob("kubernetes-v*"),
        key=lambda p: [int(x) for x in p.name.removeprefix("kubernetes-v").split(".")],
    )
    if not found:
        raise RuntimeError("no Kubernetes binaries: run scripts/real-node build")
    return found[-1]


def parse_env_lines(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("AKRI_"):
            env[key] = value
    return env


def run(cmd: list[str], *, timeout: float = 120, env: dict | None = None, check: bool = True):
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done


class NodeControl:
    """scripts/real-node: reused if it runs, else started here (and then stopped here)."""

    def __init__(self) -> None:
        self.started_here = False
        self.apiserver_started_here = False
        self.env: dict[str, str] = {}

    def ensure(self) -> dict[str, str]:
        api = run([str(REAL_APISERVER), "status"], check=False, timeout=60)
        self.apiserver_started_here = api.returncode != 0
        status = run([str(REAL_NODE), "status"], check=False, timeout=60)
        if status.returncode == 0 and "AKRI_REAL_NODE=" in status.stdout:
            # start again all the same (a second): it starts what is missing and restarts the
            # API server if someone restarted it without the node's flags (RBAC, the
            # ServiceAccount admission plugin the deployed agent's token needs).
            status = run([str(REAL_NODE), "start"], timeout=600)
            log("reusing the running node")
        else:
            t0 = time.monotonic()
            status = run([str(REAL_NODE), "start"], timeout=1800)
            self.started_here = True
            log(f"node started by the suite in {time.monotonic() - t0:.1f} s")
        self.env = parse_env_lines(status.stdout)
        return self.env

    def restart_kubelet(self) -> float:
        t0 = time.monotonic()
        run([str(REAL_NODE), "restart-kubelet"], timeout=300)
        return time.monotonic() - t0

    def restart_scheduler(self, config: str | None) -> None:
        """Stop the node's kube-scheduler (started by scripts/real-node, pid in its run dir) and
        let ``start`` start it again, with ``config`` (AKRI_REAL_NODE_SCHEDULER_CONFIG) or the
        plain configuration; ``start`` leaves what runs alone."""
        pid_file = ROOT / "var" / "real-node" / "run" / "kube-scheduler.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            pid_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop("AKRI_REAL_NODE_SCHEDULER_CONFIG", None)
        if config:
            env["AKRI_REAL_NODE_SCHEDULER_CONFIG"] = config
        run([str(REAL_NODE), "start"], timeout=600, env=env)
        # A kube-scheduler copying the admin kubeconfig leaves a note; "start" cleans it in stop.

    def akri_image(self) -> tuple[str, float]:
        """``scripts/real-node akri-image``: the project's image built by deploy/build-image
        (when the code is newer than the last build) and imported into the node's containerd;
        (its name there, seconds)."""
        t0 = time.monotonic()
        done = run([str(REAL_NODE), "akri-image"], timeout=1500)
        for line in done.stderr.splitlines():
            log(line)
        return parse_env_lines(done.stdout)["AKRI_REAL_NODE_IMAGE"], time.monotonic() - t0

    def stop(self) -> None:
        if self.started_here:
            run([str(REAL_NODE), "stop"], timeout=600, check=False)
            log("node stopped (the suite started it)")
        if self.apiserver_started_here:
            run([str(REAL_APISERVER), "stop"], timeout=300, check=False)
            log("API server stopped (the suite started it)")


class HostProcess:
    """A manage.py command run as a host process, logging to a file, stopped by its pid."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log(f"started {name} (pid {self.proc.pid}), log {self.log_path}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        log(f"stopped {self.name} (exit {self.proc.returncode})")


def base_env(kubeconfig: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AKRI_", "DJANGO_", "PYTEST", "DATABASE_URL", "REDIS_URL"))
    }
    env["KUBECONFIG"] = kubeconfig
    env.update(extra)
    return env


def agent_env(kubeconfig: str, node: str, sqlite_path: str, metrics_port: int) -> dict[str, str]:
    """deploy/base/agent.yaml's env for its containers (migrate and agent), as a host process:
    the downward API's NODE_NAME and AKRI_NAMESPACE written out, the Secret's SECRET_KEY a
    fresh one, the ConfigMap's LOG_LEVEL (INFO), KUBECONFIG the admin kubeconfig."""
    return base_env(
        kubeconfig,
        METRICS_PORT=str(metrics_port),
        NODE_NAME=node,
        AKRI_NAMESPACE=AKRI_NAMESPACE,
        AKRI_AGENT_ONLY="true",
        AKRI_REQUIRED_SETTINGS="NODE_NAME",
        AKRI_SQLITE_PATH=sqlite_path,
        DISCOVERY_HANDLERS_DIRECTORY="/var/lib/akri",
        SECRET_KEY=secrets.token_urlsafe(50),
        LOG_LEVEL="INFO",
    )


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.05
) -> tuple[Any, float]:
    """Poll ``probe`` until it returns something truthy; (that, seconds waited)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = None
    while True:
        last = probe()
        if last:
            return last, time.monotonic() - t0
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def configuration(
    name: str, descriptions: list[str], *, capacity: int, unique: bool = True
) -> dict[str, Any]:
    """An Akri debugEcho Configuration, as tests/test_agent_lifecycle.py writes one."""
    details = "descriptions:\n" + "".join(f"- {d}\n" for d in descriptions)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Configuration",
        "metadata": {"name": name, "namespace": AKRI_NAMESPACE},
        "spec": {
            "discoveryHandler": {"name": "debugEcho", "discoveryDetails": details},
            "capacity": capacity,
            "uniqueDevices": unique,
        },
    }


def device_pod(name: str, resource: str, count: int = 1, **meta: Any) -> dict[str, Any]:
    """A busybox pod asking ``count`` of ``resource``, printing its env and then sleeping; no
    nodeName: the real kube-scheduler places it."""
    limits = {resource: str(count)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env | sort; exec sleep 3600"],
                    "resources": {"limits": limits, "requests": limits},
                }
            ],
        },
    }


@contextlib.contextmanager
def hosts_line(ip: str, name: str) -> Iterator[None]:
    """A temporary /etc/hosts line (removed after, with nothing else touched)."""
    line = f"{ip} {name} {HOSTS_MARK}\n"
    original = HOSTS_FILE.read_text()
    if not original.endswith("\n"):
        line = "\n" + line
    with HOSTS_FILE.open("a") as f:
        f.write(line)
    try:
        yield
    finally:
        now = HOSTS_FILE.read_text()
        kept = "".join(ln for ln in now.splitlines(keepends=True) if HOSTS_MARK not in ln)
        HOSTS_FILE.write_text(kept)


KUBELET_LOG = ROOT / "var" / "real-node" / "run" / "kubelet.log"


def kubelet_registrations(resources: list[str], since: float) -> list[float]:
    """Wall-clock times (after ``since``) of the kubelet's "Got registration request from
    device plugin" lines for ``resources``, one per resource (the latest), from its klog."""
    import datetime as dt
    import re

    wanted = {f'resourceName="{r}"': r for r in resources}
    found: dict[str, float] = {}
    year = dt.datetime.fromtimestamp(since, dt.UTC).year
    pattern = re.compile(r"^I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)")
    with contextlib.suppress(OSError):
        for line in KUBELET_LOG.read_text(errors="replace").splitlines():
            if "Got registration request from device plugin" not in line:
                continue
            key = next((k for k in wanted if k in line), None)
            m = pattern.match(line)
            if key is None or m is None:
                continue
            stamp = dt.datetime.strptime(
                f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f"
            ).replace(tzinfo=dt.UTC)
            if stamp.timestamp() >= since:
                found[wanted[key]] = stamp.timestamp()
    return list(found.values())


PG_BIN = Path("/usr/lib/postgresql/15/bin")


class ExternalServices:
    """What deploy/overlays/external expects a user to have: PostgreSQL and Redis, here private
    instances of Debian's (postgresql-15, redis-server) on the node's address, where the pods
    reach them, with passwords; their data under ``workdir``, stopped by their pids."""

    def __init__(self, workdir: Path, address: str) -> None:

        self.address = address
        self.procs: list[subprocess.Popen] = []
        self.pg_port, self.redis_port = 15432, 16379
        self.password = secrets.token_hex(16)
        self.pg_log = self.redis_log = None
        try:
            self._start(workdir, address)
        except BaseException:
            self.stop()  # what started, by its pid: nothing left holding the ports
            raise

    def _start(self, workdir: Path, address: str) -> None:
        import pwd
        import shutil

        # Not under pytest's temporary directory: PostgreSQL's user could not enter it.
        shutil.rmtree(workdir, ignore_errors=True)
        pgdata = workdir / "pgdata"
        pgdata.mkdir(parents=True)
        # initdb refuses root: PostgreSQL's files belong to its own user, as Debian's do.
        pg = pwd.getpwnam("postgres")
        shutil.chown(workdir, pg.pw_uid, pg.pw_gid)
        shutil.chown(pgdata, pg.pw_uid, pg.pw_gid)
        pwfile = workdir / "pgpass"
        pwfile.write_text(self.password + "\n")
        shutil.chown(pwfile, pg.pw_uid, pg.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
        run(
            [*as_pg, str(PG_BIN / "initdb"), "-D", str(pgdata), "-U", "akri",
             f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8"],
            timeout=120,
        )  # fmt: skip
        with (pgdata / "pg_hba.conf").open("a") as f:
            f.write(f"host all all {address}/32 scram-sha-256\n")
            f.write("host all all 10.86.0.0/16 scram-sha-256\n")
        self.pg_log = open(workdir / "postgres.log", "w")  # noqa: SIM115 - closed in stop()
        self.procs.append(
            subprocess.Popen(
                [*as_pg, str(PG_BIN / "postgres"), "-D", str(pgdata), "-p", str(self.pg_port),
                 "-c", f"listen_addresses={address}", "-c", f"unix_socket_directories={pgdata}",
                 "-c", "max_connections=100"],
                stdout=self.pg_log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
        self.redis_log = open(workdir / "redis.log", "w")  # noqa: SIM115 - closed in stop()
        self.procs.append(
            subprocess.Popen(
                ["redis-server", "--port", str(self.redis_port), "--bind", address,
                 "--requirepass", self.password, "--save", "", "--appendonly", "no",
                 "--dir", str(workdir)],
                stdout=self.redis_log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
        import socket

        def listening(port: int) -> bool:
            with socket.socket() as s:
                return s.connect_ex((address, port)) == 0

        wait_for("PostgreSQL and Redis", lambda: listening(self.pg_port) and listening(
            self.redis_port), 60, 0.2)  # fmt: skip
        # The database the Secret names, owned by akri (the superuser initdb made); retried
        # while the server still says it is starting up.
        create = [*as_pg, str(PG_BIN / "psql"), "-h", str(pgdata), "-p", str(self.pg_port),
                  "-U", "akri", "-d", "postgres", "-c", "CREATE DATABASE akri"]  # fmt: skip
        pg_env = dict(os.environ, PGPASSWORD=self.password)
        wait_for(
            "CREATE DATABASE akri",
            lambda: run(create, timeout=60, env=pg_env, check=False).returncode == 0,
            60,
            0.5,
        )
        log(f"PostgreSQL on {address}:{self.pg_port}, Redis on {address}:{self.redis_port}")

    @property
    def database_url(self) -> str:
        return f"postgres://akri:{self.password}@{self.address}:{self.pg_port}/akri"

    @property
    def redis_url(self) -> str:
        return f"redis://:{self.password}@{self.address}:{self.redis_port}/0"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                # PostgreSQL's fast shutdown is SIGINT; Redis stops on SIGTERM.
                os.killpg(proc.pid, signal.SIGINT if proc is self.procs[0] else signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        for f in (self.pg_log, self.redis_log):
            if f is not None:
                f.close()
        log("PostgreSQL and Redis stopped")
