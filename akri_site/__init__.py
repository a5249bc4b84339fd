from akri_site.env import one_line_for_bad_settings

# First, so that a bad setting read while the Celery app loads is one line too.
one_line_for_bad_settings()

from akri_site.celery import app as celery_app  # noqa: E402

__all__ = ("celery_app",)
