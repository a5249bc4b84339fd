"""What a web process does before it serves its first page (issue 32 §4).

Without it the first request after a restart paid for everything a process does once: every
view module imported through the URLconf (600 ms under load), every template it renders
compiled, and the counts of the whole cache the pages keep (``slotmap.CostlyReuse``: 100-300
ms each at 40,000 Instances). ``warm_up`` does these at start-up, in each uvicorn worker as it
imports the ASGI application (``akri_site.asgi``, when ``manage.py runweb`` runs it), and from
then on has kept counts recounted in the background once they are due, so that no request
waits for one.

A database that is not there yet does not stop the web: the counts are then made by the first
request that needs them, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


def warm_up() -> float:
    """Import the views, compile the templates, count what the pages keep; seconds taken."""
    from django.conf import settings
    from django.template import TemplateDoesNotExist, TemplateSyntaxError
    from django.template.loader import get_template
    from django.urls import get_resolver, reverse
    from django.utils import translation

    from akri_site.dashboard import slotmap

    started = time.monotonic()
    resolver = get_resolver()
    resolver.url_patterns  # noqa: B018  (imports every view module)
    # The URL names' tables, one per namespace (150 ms on a first page for the dashboard's).
    reverse("dashboard:overview")
    for _prefix, namespaced in resolver.namespace_dict.values():
        namespaced.reverse_dict  # noqa: B018
    translation.gettext("Page")  # the translation catalogues, read once per process
    # What a page imports on first use: the Lease API of the overview's leaders card (400 ms).
    from kubernetes.client.api import coordination_v1_api  # noqa: F401

    for directory in settings.TEMPLATES[0]["DIRS"]:
        for path in sorted(Path(directory).rglob("*.html")):
            with contextlib.suppress(TemplateDoesNotExist, TemplateSyntaxError):
                get_template(str(path.relative_to(directory)))
    slotmap.CostlyReuse.refresh_in_background = True
    # In a thread of its own: uvicorn imports the application inside its event loop, where
    # Django refuses database access.
    counting = threading.Thread(target=_count, name="dashboard-warm-up")
    counting.start()
    counting.join()
    took = time.monotonic() - started
    log.info("web warmed up in %.1f s: views imported, templates compiled, counts made", took)
    return took


def _count() -> None:
    from django.db import connection

    from akri_site.dashboard import queries, slotmap

    try:
        slotmap.summary()
        queries.visible_per_node()
        queries.instances_per_configuration()
        queries.stuck()
    except Exception as exc:  # the database away: the first page counts, as without warm-up
        log.warning("the web starts without its counts (%s); the first page will count", exc)
    finally:
        connection.close()  # this thread's own
