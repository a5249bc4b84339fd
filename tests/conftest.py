import os

# Playwright's sync API runs an event loop in the test thread; Django must allow ORM calls there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytest_plugins = ["tests.kubeenv"]


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_reused_counts():
    """The dashboard keeps a costly count for a while (CostlyReuse); on a loaded machine even a
    test's small count can be costly enough to be kept, and then the next test, on another
    database, would read it. Every test starts without kept answers."""
    from akri_site.dashboard.slotmap import CostlyReuse

    CostlyReuse.forget_all()
    yield
