"""ASGI entry point: HTTP through Django (static files by whitenoise; the admission webhook
ahead of it where this process serves it: ``AKRI_WEB_ROLE``), websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
# Build the Django app before importing consumers: they import models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from agent.queues.fastpath import WebhookApp, webhook_only  # noqa: E402
from akri_site import env  # noqa: E402
from akri_site.dashboard.origin import SameOriginValidator  # noqa: E402
from akri_site.dashboard.routing import websocket_urlpatterns  # noqa: E402

ROLE = settings.AKRI_WEB_ROLE
if ROLE != "webhook" and env.boolean("AKRI_WEB_PROCESS", False):
    # runweb's workers (manage.py sets the variable): ready before the first page, not by it.
    from akri_site.dashboard.warmup import warm_up  # noqa: E402

    warm_up()
if ROLE == "webhook":
    # runweb --webhook: the admission webhook alone; every other path is a 404, no websocket.
    application = webhook_only()
else:
    application = ProtocolTypeRouter(
        {
            # The admission webhook is answered ahead of Django (agent.queues.fastpath), but
            # only where one process serves both (AKRI_WEB_ROLE=all): on the pages' port in
            # production it would be reachable through the ingress, before the host check.
            "http": WebhookApp(django_asgi_app) if ROLE == "all" else django_asgi_app,
            "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
