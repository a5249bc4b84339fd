"""The extender's verdict rows (the Scheduling page): written off the scheduler's path, kept
through a database outage, never held up by one bad row, and pruned."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import DataError, OperationalError
from django.utils import timezone

from agent.scheduling import recorder as recorder_module
from agent.scheduling.models import PodVerdict
from agent.scheduling.recorder import VerdictRecorder, prune, verdict_fields

pytestmark = pytest.mark.django_db(transaction=True)

REASON = "1 unique cam devices requested, 0 of 1 free on node n1"


def waiting(recorder: VerdictRecorder, name: str, reason: str = REASON) -> None:
    recorder.record_decision("apps", name, f"uid-{name}", [], {"n1": reason}, {}, "")


class FailingWrites:
    """PodVerdict.objects.update_or_create, failing with ``error`` for the pods named."""

    def __init__(self, monkeypatch, error: Exception, names: set[str]) -> None:
        self.real = PodVerdict.objects.update_or_create
        self.error = error
        self.names = names
        monkeypatch.setattr(PodVerdict.objects, "update_or_create", self)

    def __call__(self, **kwargs):
        if kwargs["name"] in self.names:
            raise self.error
        return self.real(**kwargs)


def test_a_verdict_whose_write_failed_is_written_by_the_next_flush(monkeypatch):
    recorder = VerdictRecorder()
    waiting(recorder, "cams-3")
    outage = FailingWrites(monkeypatch, OperationalError("the database went away"), {"cams-3"})

    recorder.flush()

    assert recorder.errors == 1
    assert not PodVerdict.objects.exists()
    outage.names.clear()  # the database is back

    recorder.flush()

    verdict = PodVerdict.objects.get(namespace="apps", name="cams-3")
    assert verdict.failed == {"n1": REASON} and verdict.uid == "uid-cams-3"


def test_a_newer_verdict_queued_during_the_outage_is_the_one_written(monkeypatch):
    recorder = VerdictRecorder()
    waiting(recorder, "cams-3", "old reason")
    outage = FailingWrites(monkeypatch, OperationalError("the database went away"), {"cams-3"})
    recorder.flush()
    waiting(recorder, "cams-3", "new reason")
    outage.names.clear()

    recorder.flush()

    assert PodVerdict.objects.get(name="cams-3").failed == {"n1": "new reason"}


def test_a_row_the_database_refuses_is_dropped_and_the_others_are_written(monkeypatch):
    """PostgreSQL refuses a value its column cannot hold (DataError): that row is refused
    forever, so it is dropped, and the verdicts queued beside it are written."""
    recorder = VerdictRecorder()
    for name in ("refused", "after-1", "after-2"):
        waiting(recorder, name)
    FailingWrites(monkeypatch, DataError("value too long"), {"refused"})

    recorder.flush()
    recorder.flush()

    assert set(PodVerdict.objects.values_list("name", flat=True)) == {"after-1", "after-2"}
    assert recorder.dropped == 1 and recorder.errors == 0


def test_a_name_no_column_can_hold_never_blocks_the_verdicts_after_it():
    """Issue 29: a 253+ character pod name stopped every later verdict until a restart. The
    extender refuses such a request outright; the recorder drops such a row even so."""
    recorder = VerdictRecorder()
    waiting(recorder, "p" * 300)
    waiting(recorder, "cams-3")

    recorder.flush()

    assert list(PodVerdict.objects.values_list("name", flat=True)) == ["cams-3"]
    assert recorder.dropped == 1


def make_rows(count: int, age: timedelta, prefix: str) -> None:
    at = timezone.now() - age
    fields = verdict_fields([], {"n1": REASON}, {}, "")
    PodVerdict.objects.bulk_create(
        PodVerdict(namespace="apps", name=f"{prefix}-{i}", at=at, **fields) for i in range(count)
    )


def test_verdicts_untouched_for_the_retention_are_pruned():
    make_rows(30, timedelta(hours=2), "gone")
    make_rows(5, timedelta(minutes=1), "waiting")

    assert prune() == 30

    assert PodVerdict.objects.count() == 5
    assert not PodVerdict.objects.filter(name__startswith="gone").exists()


def test_no_more_than_the_cap_is_kept_newest_first():
    make_rows(20, timedelta(minutes=5), "older")
    make_rows(10, timedelta(minutes=1), "newer")

    assert prune(keep=12) == 18

    names = set(PodVerdict.objects.values_list("name", flat=True))
    assert len(names) == 12
    assert {f"newer-{i}" for i in range(10)} <= names


def test_the_recorders_thread_prunes_as_it_writes(monkeypatch):
    monkeypatch.setattr(recorder_module, "COALESCE_SECONDS", 0.01)
    make_rows(3, timedelta(hours=2), "gone")
    recorder = VerdictRecorder(prune_seconds=0).start()
    try:
        waiting(recorder, "cams-3")
        deadline = time.monotonic() + 10
        while PodVerdict.objects.filter(name__startswith="gone").exists():
            assert time.monotonic() < deadline, "not pruned within 10 s"
            time.sleep(0.02)
    finally:
        recorder.stop()
    assert list(PodVerdict.objects.values_list("name", flat=True)) == ["cams-3"]
