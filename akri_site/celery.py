"""The Celery app: cluster-wide reconciliation and broker deployment run here."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")

app = Celery("akri_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
