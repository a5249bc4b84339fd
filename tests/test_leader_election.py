"""Leader election on a Lease (agent.leader): in-process candidates with a fake clock, then
real processes killed and frozen against the API server (the simulator, or
AKRI_TEST_KUBECONFIG's), with the server's own order of writes as the judge."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from agent.bench.failover import (
    LEASE,
    WORK,
    Candidates,
    Worker,
    WriteLog,
    late_writes,
    request_log_writers,
)
from agent.domain.lease import Timing
from agent.leader import CONTROLLER_LEASE
from agent.leader.election import LeaderElector
from akri_site.celery import app as celery_app

pytestmark = pytest.mark.kube

ROOT = Path(__file__).resolve().parent.parent
TIMING = Timing()  # the defaults: 8 s lease, 5 s renew deadline, 1.5 s retry
FAST = Timing(3.0, 2.0, 0.5)
# The bound. FAST timing needs about 4 s; the slack is for a loaded 2-core machine.
FAILOVER_BOUND = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease_spec(kube, name: str = LEASE) -> dict:
    api = client.CoordinationV1Api(kube.api_client)
    raw = api.read_namespaced_lease(name, kube.namespace, _preload_content=False)
    return json.loads(raw.data)["spec"]


def holder(kube, name: str = LEASE) -> str | None:
    """The Lease's holder, or None while it does not exist yet (before the first elector's
    write): for waits, which must treat "not yet" as not yet, whatever the server answers."""
    try:
        return lease_spec(kube, name).get("holderIdentity")
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


# Electors a test made: stopped after it (their callbacks' thread starts on leading).
MADE: list[LeaderElector] = []


@pytest.fixture(autouse=True)
def _stop_electors(request):
    if "kube" in request.fixturenames:
        request.getfixturevalue("kube")  # stopped before the test's namespace goes
    yield
    while MADE:
        MADE.pop().stop()


def elector(kube, identity: str, clock: Clock, **kwargs) -> LeaderElector:
    made = LeaderElector(
        kube.new_client(), kube.namespace, LEASE, identity=identity, timing=TIMING, clock=clock,
        **kwargs,
    )  # fmt: skip
    MADE.append(made)
    return made


def test_the_first_candidate_creates_the_lease_and_the_second_waits(kube):
    clock = Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.step() is True
    assert b.step() is False
    assert a.is_leading() and not b.is_leading()
    spec = lease_spec(kube)
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == TIMING.lease_duration
    assert spec["leaseTransitions"] == 0


def test_a_leader_that_cannot_renew_stops_before_its_lease_can_be_taken(kube):
    clock = Clock()
    stopped = []
    a = elector(kube, "a", clock, on_stopped=lambda: stopped.append("a"))
    b = elector(kube, "b", clock)
    a.step()
    b.step()  # b sees a's renew now: its lease runs from here
    clock.now += TIMING.renew_deadline + 0.01
    assert not a.is_leading()  # the fence closes at the renew deadline...
    assert b.step() is False  # ...while the lease is still a's
    clock.now += TIMING.lease_duration - TIMING.renew_deadline
    assert b.step() is True
    assert a.step() is False
    a.stop()  # waits for on_stopped, which runs on the elector's own callback thread
    assert stopped == ["a"]
    spec = lease_spec(kube)
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


def test_a_write_from_a_stale_read_is_refused_so_two_candidates_cannot_both_win(kube):
    clock = Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    a.step()
    b.step()
    clock.now += TIMING.lease_duration + 1
    stale = b._read()  # b decides on this version...
    assert elector(kube, "c", clock).step() is False  # (c saw it only now: it must wait)
    assert a.step() is True  # ...but a renews first
    b._read = lambda: stale
    assert b.step() is False  # the replace carries the stale resourceVersion: 409
    assert lease_spec(kube)["holderIdentity"] == "a"


def test_a_clean_shutdown_releases_the_lease_and_the_other_takes_over_at_its_next_retry(kube):
    a = LeaderElector(kube.new_client(), kube.namespace, LEASE, identity="a", timing=TIMING)
    b = LeaderElector(kube.new_client(), kube.namespace, LEASE, identity="b", timing=TIMING)
    a.start()
    kube.wait_for(a.is_leading, timeout=10, message="a leads")
    b.start()
    try:
        stopped_at = time.monotonic()
        a.stop()
        assert lease_spec(kube)["holderIdentity"] in ("", "b")
        kube.wait_for(b.is_leading, timeout=TIMING.lease_duration, message="b leads")
        # Well before the lease could have run out: the release handed it over.
        assert time.monotonic() - stopped_at < TIMING.lease_duration
    finally:
        b.stop()
    assert lease_spec(kube)["holderIdentity"] == ""


def test_an_api_server_error_is_not_leadership_and_is_survived(kube):
    clock = Clock()
    a = elector(kube, "a", clock)
    if kube.simulator is None:
        pytest.skip("fault injection needs the simulator")
    kube.simulator.inject_fault("*", "/leases", status=500, times=1)
    assert a.step() is False
    assert a.step() is True


# --- the work's fences ----------------------------------------------------------------------


def work_writer(kube) -> str:
    api = client.CoreV1Api(kube.api_client)
    return (api.read_namespaced_config_map(WORK, kube.namespace).data or {}).get("writer", "")


@pytest.fixture
def work(kube):
    core = client.CoreV1Api(kube.api_client)
    core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": WORK}})
    return lambda identity, leading: Worker(
        client.CoreV1Api(kube.new_client()), kube.namespace, identity, leading
    )


def test_a_write_decided_before_a_freeze_is_refused_once_the_successor_has_written(kube, work):
    old = work("old", lambda: True)
    old.send(old.decide())  # leading: its version is the one it wrote
    body = old.decide()  # decided while leading... then frozen here
    new = work("new", lambda: True)
    new.send(new.decide())  # the successor takes over and writes
    with pytest.raises(client.ApiException) as refused:
        old.send(body)  # ...and sent on waking
    assert refused.value.status == 409
    assert work_writer(kube) == "new"


def test_a_refused_writer_reads_again_and_writes_only_while_it_still_leads(kube, work):
    leading = [True]
    old = work("old", lambda: leading[0])
    old.send(old.decide())
    new = work("new", lambda: True)
    new.send(new.decide())
    body = old.decide()
    with pytest.raises(client.ApiException):
        old.send(body)
    leading[0] = False  # the time fence has closed by the time it tries again
    old.tick()
    assert work_writer(kube) == "new"
    leading[0] = True  # (had it still led, it would read the new version and write)
    old.tick()
    assert work_writer(kube) == "old"


def test_a_freeze_between_deciding_to_lead_and_reading_is_caught_by_the_second_check(kube, work):
    answers = iter([True, False])  # leading before the read, deposed after it
    old = work("old", lambda: next(answers))
    new = work("new", lambda: True)
    new.send(new.decide())
    assert old.decide() is None
    assert work_writer(kube) == "new"


def test_late_writes_count_each_stray_write_once():
    assert late_writes(["a", "a", "b", "b"]) == 0
    assert late_writes(["a", "b", "a", "b", "b"]) == 1  # the newer one's writes are not late
    assert late_writes(["a", "b", "c", "b", "a"]) == 2
    assert late_writes([]) == 0


# --- real processes -------------------------------------------------------------------------


@pytest.fixture
def candidates(kube, tmp_path):
    core = client.CoreV1Api(kube.api_client)
    core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": WORK}})
    log = WriteLog(kube.new_client(), kube.namespace).start()
    cands = Candidates(kube.kubeconfig, kube.namespace, FAST, str(tmp_path))
    cands.spawn_standby()
    cands.spawn_standby()
    try:
        yield cands, log
    finally:
        cands.close()
        log.stop()


def test_the_other_process_takes_over_within_the_bound_when_the_leader_is_killed(kube, candidates):
    cands, log = candidates
    log.first_write_by_other(set(), 0.0, timeout=30)
    leader = log.writers()[-1]
    killed_at = time.monotonic()
    cands.kill(leader)
    at, successor = log.first_write_by_other({leader}, killed_at, timeout=30)
    assert successor != leader
    assert at - killed_at < FAILOVER_BOUND
    assert lease_spec(kube)["holderIdentity"] == successor
    assert late_writes(log.writers()) == 0


def test_a_frozen_leader_that_wakes_up_deposed_writes_nothing(kube, candidates):
    cands, log = candidates
    log.first_write_by_other(set(), 0.0, timeout=30)
    leader = log.writers()[-1]
    frozen_at = time.monotonic()
    cands.signal(leader, signal.SIGSTOP)
    _, successor = log.first_write_by_other({leader}, frozen_at, timeout=30)
    cands.signal(leader, signal.SIGCONT)
    # Let the woken process run several retries: a deposed leader writing would show here.
    deadline = time.monotonic() + 5 * FAST.retry_period
    while time.monotonic() < deadline:
        assert late_writes(log.writers()) == 0
        time.sleep(FAST.retry_period / 2)
    assert lease_spec(kube)["holderIdentity"] == successor
    writers = log.writers()
    assert writers.count(successor) > 0 and late_writes(writers) == 0
    if kube.simulator is not None:
        # The server's log of requests, refused ones too: the woken process may have had one
        # write decided before the freeze (the version fence refused it, as the watch shows);
        # a second would be one decided after it wakes, which the time fence forbids.
        requested = request_log_writers(kube.simulator, kube.namespace)
        assert leader in requested and successor in requested
        assert late_writes(requested) <= 1


# --- the controller command -----------------------------------------------------------------


def _controller(kube, tmp_path, db: Path, name: str) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(
        AKRI_SQLITE_PATH=str(db), KUBECONFIG=kube.kubeconfig, AKRI_NAMESPACE=kube.namespace,
        AKRI_LEASE_DURATION=str(FAST.lease_duration),
        AKRI_LEASE_RENEW_DEADLINE=str(FAST.renew_deadline),
        AKRI_LEASE_RETRY_PERIOD=str(FAST.retry_period),
    )  # fmt: skip
    out = tmp_path / f"{name}.log"
    with out.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runcontroller"], cwd=ROOT, env=env,
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, out


def _identity(kube, log: Path) -> str:
    def announced():
        for line in log.read_text().splitlines():
            if line.startswith("controller ") and ": candidate for Lease" in line:
                return line.split()[1].rstrip(":")
        return None

    return kube.wait_for(announced, timeout=60, interval=0.1, message=f"a candidate in {log}")


@pytest.fixture
def db(tmp_path) -> Path:
    """A migrated SQLite database for controller processes (theirs, not the test's)."""
    path = tmp_path / "controller.sqlite3"
    env = {**os.environ, "AKRI_SQLITE_PATH": str(path)}
    env.pop("DATABASE_URL", None)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120
    )
    return path


def test_two_controller_replicas_elect_one_and_the_survivor_takes_over(kube, tmp_path, db):
    procs = {}
    try:
        for name in ("one", "two"):
            proc, out = _controller(kube, tmp_path, db, name)
            procs[_identity(kube, out)] = proc

        leader = kube.wait_for(
            lambda: holder(kube, CONTROLLER_LEASE), timeout=30, message="a controller leads"
        )
        assert leader in procs
        procs[leader].kill()
        procs.pop(leader).wait(10)
        (survivor,) = procs
        kube.wait_for(
            lambda: holder(kube, CONTROLLER_LEASE) == survivor,
            timeout=FAILOVER_BOUND,
            message="takeover",
        )
        procs[survivor].send_signal(signal.SIGTERM)
        # The Lease is released first, at once; stopping the watchers may take a while on a
        # loaded machine (a watcher still in its first list finishes it).
        try:
            kube.wait_for(
                lambda: holder(kube, CONTROLLER_LEASE) == "",
                timeout=30,
                message="the Lease released",
            )
        except AssertionError as exc:
            procs[survivor].send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
            time.sleep(1)
            logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
            raise AssertionError(f"{exc}\n{logs}") from None
        try:
            code = procs[survivor].wait(90)
        except subprocess.TimeoutExpired:
            code = None
        logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
        assert code == 0, logs
        procs.pop(survivor)
        assert holder(kube, CONTROLLER_LEASE) == "", logs
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(10)


SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread of another process (Linux's tgkill; Python has no wrapper)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


@pytest.mark.skipif(
    SYS_TGKILL is None, reason="tgkill's syscall number is known for x86-64 and arm64"
)
def test_a_sigterm_the_kernel_hands_to_another_thread_still_stops_the_controller(
    kube, tmp_path, db
):
    proc, out = _controller(kube, tmp_path, db, "one")
    try:
        identity = _identity(kube, out)
        kube.wait_for(
            lambda: holder(kube, CONTROLLER_LEASE) == identity,
            timeout=30,
            message="it leads",
        )
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        _tgkill(proc.pid, others[0], signal.SIGTERM)
        code = proc.wait(30)
        assert code == 0, out.read_text()
        assert lease_spec(kube, CONTROLLER_LEASE)["holderIdentity"] == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# --- Celery beat ----------------------------------------------------------------------------


def beat(kube, identity: str, clock: Clock, sent: list):
    from agent.leader.beat import LeaderScheduler
    from akri_site.celery import app

    scheduler = LeaderScheduler(app=app, lazy=True)
    scheduler.elector = elector(kube, identity, clock)
    scheduler.data = {}
    scheduler.setup_schedule()  # the beat_schedule of akri_site.celery; elector already set
    scheduler.apply_async = lambda entry, **kw: sent.append((identity, entry.name))
    for entry in scheduler.schedule.values():  # everything due, as for a beat up for a while
        entry.last_run_at = entry.default_now() - dt.timedelta(hours=2)
    return scheduler


def test_only_the_leading_beat_sends_and_the_other_sends_once_it_takes_over(kube):
    clock = Clock()
    sent: list = []
    a, b = beat(kube, "beat-a", clock, sent), beat(kube, "beat-b", clock, sent)
    a.elector.step()
    b.elector.step()
    for _ in range(len(a.schedule) + 1):  # a tick sends one due entry
        a.tick()
        b.tick()
    assert {who for who, _ in sent} == {"beat-a"}
    assert {name for _, name in sent} == set(
        celery_app.conf.beat_schedule
    )  # every entry of akri_site.celery
    clock.now += TIMING.renew_deadline + 0.01
    sent.clear()
    a.tick()
    a.apply_entry(next(iter(a.schedule.values())))  # the fence, even past tick's own check
    assert sent == []
    clock.now += TIMING.lease_duration
    assert b.elector.step() is True
    for _ in range(4):
        b.tick()
    assert {who for who, _ in sent} == {"beat-b"}
    b.close()
    assert lease_spec(kube)["holderIdentity"] == ""
