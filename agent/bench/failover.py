"""The ``failover`` benchmark, and the candidate process it (and the tests) run.

Two candidate processes campaign for one Lease through ``agent.leader.election``. While it
leads, a candidate writes a ConfigMap (``failover-work``) every 100 ms, naming itself in the
data and as ``fieldManager``. Two fences guard each write, as they guard the project's own
writes:

- a time fence: the write is decided only after ``is_leading()`` said yes, which closes at
  the renew deadline, so a process woken after losing the Lease decides nothing more;
- a version fence: the write carries the ``resourceVersion`` the candidate read (or wrote)
  while leading, so a write decided just before a freeze and sent after it is refused (409)
  once the successor has written. The time fence alone cannot close that window: nothing
  checks the clock between the decision and the bytes leaving.

The API server's order of those writes (a watch on the ConfigMap, and on the simulator its
``request_log``) is the write log the figures come from:

- ``p95_s``: from SIGKILL of the leader to the first write of the other candidate accepted;
- ``dual_leader_writes``: writes accepted from a candidate after a newer one has written,
  counted over kill rounds and freeze rounds (SIGSTOP the leader until the other takes over,
  then SIGCONT: the woken one must not write). A candidate that was superseded is replaced,
  so an identity never writes legitimately after a newer one;
- ``fenced_writes`` (simulator only): write requests from a deposed candidate that the
  version fence refused, at most one per freeze (the one decided before it).

Run a candidate alone: ``python -m agent.bench.failover --kubeconfig K --namespace N``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from agent.bench import percentile
from agent.domain.lease import Timing

LEASE = "failover-bench"
WORK = "failover-work"
WRITE_INTERVAL = 0.1
READY = "campaigning"
ROOT = Path(__file__).resolve().parents[2]

# --- the candidate process ------------------------------------------------------------------


class Worker:
    """The work a candidate does while it leads, one tick at a time, behind both fences (see
    the module docstring). ``decide`` and ``send`` are apart so that a test can put a freeze
    between them."""

    def __init__(
        self, core: client.CoreV1Api, namespace: str, identity: str, leading: Callable[[], bool]
    ) -> None:
        self.core, self.namespace, self.identity, self.leading = core, namespace, identity, leading
        self.seq = 0
        self.version: str | None = None  # of the work ConfigMap, read or written while leading

    def decide(self) -> dict[str, Any] | None:
        """The next write's body, or None when we must not write."""
        if not self.leading():
            self.version = None
            return None
        if self.version is None:
            self.version = self.core.read_namespaced_config_map(
                WORK, self.namespace, _request_timeout=2.0
            ).metadata.resource_version
            # Read first, check again: a freeze before the read fails this check, a freeze
            # after it leaves the version stale for the server to refuse.
            if not self.leading():
                return None
        self.seq += 1
        return {
            "metadata": {"resourceVersion": self.version},
            "data": {"writer": self.identity, "seq": str(self.seq)},
        }

    def send(self, body: dict[str, Any]) -> None:
        try:
            answer = self.core.patch_namespaced_config_map(
                WORK, self.namespace, body, field_manager=self.identity, _request_timeout=2.0
            )
        except Exception:
            self.version = None  # 409: written since our version; or the server away
            raise
        self.version = answer.metadata.resource_version

    def tick(self) -> None:
        with contextlib.suppress(Exception):  # the next tick reads and tries again
            body = self.decide()
            if body is not None:
                self.send(body)


def run_candidate(kubeconfig: str, namespace: str, identity: str, timing: Timing) -> None:
    from agent.leader.election import LeaderElector

    api_client = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api_client)
    elector = LeaderElector(api_client, namespace, LEASE, identity=identity, timing=timing)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client.CoordinationV1Api(api_client).list_namespaced_lease(namespace, limit=1)
    print(READY, flush=True)  # imports done and the server reached: campaigning from now on
    elector.start()
    worker = Worker(core, namespace, identity, elector.is_leading)
    while not stopping.wait(WRITE_INTERVAL):
        worker.tick()
    elector.stop()


def candidate_command(kubeconfig: str, namespace: str, identity: str, timing: Timing) -> list[str]:
    spec = f"{timing.lease_duration},{timing.renew_deadline},{timing.retry_period}"
    return [
        sys.executable, "-m", "agent.bench.failover",
        "--kubeconfig", kubeconfig, "--namespace", namespace,
        "--identity", identity, "--timing", spec,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one failover candidate (see module docstring)")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--identity", default=f"candidate-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--timing", default="8,5,1.5", help="lease,renew-deadline,retry seconds")
    args = parser.parse_args(argv)
    lease, renew, retry = (float(part) for part in args.timing.split(","))
    logging.basicConfig(
        level=logging.DEBUG if os.environ.get("AKRI_FAILOVER_DEBUG") else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    run_candidate(args.kubeconfig, args.namespace, args.identity, Timing(lease, renew, retry))


# --- watching the writes --------------------------------------------------------------------


@dataclass
class WriteLog:
    """Every accepted write of the work ConfigMap, in the API server's order (a watch)."""

    api_client: client.ApiClient
    namespace: str
    writes: list[tuple[float, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> WriteLog:
        self._thread = threading.Thread(target=self._run, daemon=True, name="failover-writes")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join: the watch in progress ends within its 2 s server-side timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        core = client.CoreV1Api(self.api_client)
        rv = core.read_namespaced_config_map(WORK, self.namespace).metadata.resource_version
        while not self._stop.is_set():
            try:
                rv = self._follow(core, rv)
            except Exception:
                if self._stop.is_set():
                    return  # the server went away at the end of the run
                raise

    def _follow(self, core: client.CoreV1Api, rv: str) -> str:
        stream = watch.Watch().stream(
            core.list_namespaced_config_map,
            self.namespace,
            field_selector=f"metadata.name={WORK}",
            resource_version=rv,
            timeout_seconds=2,
        )
        for event in stream:
            obj = event["object"]
            rv = obj.metadata.resource_version
            writer = (obj.data or {}).get("writer")
            if event["type"] == "MODIFIED" and writer:
                with self.cond:
                    self.writes.append((time.monotonic(), writer))
                    self.cond.notify_all()
        return rv

    def first_write_by_other(
        self, than: set[str], after: float, timeout: float
    ) -> tuple[float, str]:
        """(time, writer) of the first write after ``after`` by someone not in ``than``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for at, writer in self.writes:
                    if at >= after and writer not in than:
                        return at, writer
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no write by a new leader within {timeout:g} s")
                self.cond.wait(left)

    def writers(self) -> list[str]:
        with self.cond:
            return [writer for _, writer in self.writes]


def late_writes(writers: list[str]) -> int:
    """Writes by an identity after a newer identity (one that first wrote later) has written:
    with superseded candidates replaced, each one is a write by a deposed leader. Counted one
    per stray write: the newer leader's own writes around it are not late."""
    first_seen: dict[str, int] = {}
    newest = None
    late = 0
    for writer in writers:
        first_seen.setdefault(writer, len(first_seen))
        if newest is None or first_seen[writer] > first_seen[newest]:
            newest = writer
        elif writer != newest:
            late += 1
    return late


def request_log_writers(sim: Any, namespace: str) -> list[str]:
    """The simulator's own log of write requests to the work ConfigMap, in arrival order."""
    path = f"/api/v1/namespaces/{namespace}/configmaps/{WORK}"
    return [
        r.query.get("fieldManager", "?")
        for r in list(sim.request_log)
        if r.method in ("PATCH", "PUT") and r.path == path
    ]


# --- the benchmark --------------------------------------------------------------------------


class Candidates:
    """The running candidate processes, by identity."""

    def __init__(self, kubeconfig: str, namespace: str, timing: Timing, logdir: str) -> None:
        self.kubeconfig, self.namespace, self.timing, self.logdir = (
            kubeconfig, namespace, timing, logdir,
        )  # fmt: skip
        self.procs: dict[str, subprocess.Popen] = {}
        self.count = 0

    def spawn(self) -> str:
        self.count += 1
        identity = f"candidate-{self.count}"
        cmd = candidate_command(self.kubeconfig, self.namespace, identity, self.timing)
        with open(self._log(identity), "w") as log_file:
            self.procs[identity] = subprocess.Popen(
                cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT
            )
        return identity

    def spawn_standby(self, timeout: float = 60.0) -> str:
        """A new candidate, once it is a standby as in a running deployment: started (Python
        takes seconds to start on a loaded machine) and watching the Lease for a whole lease
        (a newcomer must see the Lease unchanged that long before it may take it)."""
        identity = self.spawn()
        deadline = time.monotonic() + timeout
        while READY not in Path(self._log(identity)).read_text():
            if time.monotonic() > deadline or self.procs[identity].poll() is not None:
                raise RuntimeError(
                    f"{identity} did not start: {Path(self._log(identity)).read_text()}"
                )
            time.sleep(0.05)
        time.sleep(self.timing.lease_duration)  # the standby's warm-up, a fixed window
        return identity

    def _log(self, identity: str) -> str:
        return os.path.join(self.logdir, f"{identity}.log")

    def signal(self, identity: str, sig: int) -> None:
        self.procs[identity].send_signal(sig)

    def kill(self, identity: str) -> None:
        proc = self.procs.pop(identity)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(10)

    def close(self) -> None:
        for identity in list(self.procs):
            self.kill(identity)


def kill_round(cands: Candidates, log: WriteLog, timeout: float) -> float:
    """SIGKILL the leader; seconds until the other's first write is accepted."""
    leader = log.writers()[-1]
    killed_at = time.monotonic()
    cands.kill(leader)
    at, _ = log.first_write_by_other({leader}, killed_at, timeout)
    cands.spawn_standby()
    return at - killed_at


def freeze_round(cands: Candidates, log: WriteLog, timeout: float, settle: float) -> float:
    """SIGSTOP the leader until the other writes, SIGCONT it, give it ``settle`` seconds to
    misbehave, then replace it. Returns the takeover time."""
    leader = log.writers()[-1]
    frozen_at = time.monotonic()
    cands.signal(leader, signal.SIGSTOP)
    at, _ = log.first_write_by_other({leader}, frozen_at, timeout)
    cands.signal(leader, signal.SIGCONT)
    time.sleep(settle)  # a fixed window to observe a deposed leader writing, not a wait
    cands.kill(leader)
    cands.spawn_standby()
    return at - frozen_at


def bench_failover(quick: bool = False, stdout: Any = None) -> dict[str, object]:
    from agent.simulator.apiserver import ApiServerSimulator

    timing = Timing(3.0, 2.0, 0.5) if quick else Timing()
    kills, freezes = (1, 1) if quick else (8, 2)
    timeout = timing.worst_failover + 15
    sim = ApiServerSimulator().start()
    namespace = "failover-bench"
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = str(sim.write_kubeconfig(Path(tmp) / "kubeconfig"))
        api_client = sim.api_client()
        core = client.CoreV1Api(api_client)
        core.create_namespace({"metadata": {"name": namespace}})
        core.create_namespaced_config_map(namespace, {"metadata": {"name": WORK}})
        log = WriteLog(api_client, namespace).start()
        cands = Candidates(kubeconfig, namespace, timing, tmp)
        takeovers: list[float] = []
        try:
            cands.spawn_standby()
            cands.spawn_standby()
            log.first_write_by_other(set(), 0.0, timeout)
            for i in range(kills):
                takeovers.append(kill_round(cands, log, timeout))
                _say(stdout, f"kill {i + 1}: takeover after {takeovers[-1]:.2f} s")
            for i in range(freezes):
                took = freeze_round(cands, log, timeout, settle=timing.retry_period * 3)
                _say(stdout, f"freeze {i + 1}: takeover after {took:.2f} s")
        finally:
            cands.close()
            log.stop()
            dual = late_writes(log.writers())
            fenced = late_writes(request_log_writers(sim, namespace)) - dual
            api_client.close()
            sim.stop()
    return {
        "p50_s": percentile(takeovers, 50),
        "p95_s": percentile(takeovers, 95),
        "dual_leader_writes": dual,
        "fenced_writes": fenced,
        "freezes": freezes,
        "lease_s": timing.lease_duration,
        "renew_deadline_s": timing.renew_deadline,
        "retry_s": timing.retry_period,
    }


def _say(stdout: Any, line: str) -> None:
    if stdout is not None:
        stdout.write(line)


if __name__ == "__main__":
    main()
