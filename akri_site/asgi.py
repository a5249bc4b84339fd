"""ASGI entry point: HTTP through Django (static files by whitenoise; the admission webhook
ahead of it), websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "akri_site.settings")
# Build the Django app before importing consumers: they import models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agent.queues.fastpath import WebhookApp  # noqa: E402
from akri_site.dashboard.origin import SameOriginValidator  # noqa: E402
from akri_site.dashboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The admission webhook is answered ahead of Django (agent.queues.fastpath).
        "http": WebhookApp(django_asgi_app),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
