from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from agent.queues.pages import api_urlpatterns
from akri_site.dashboard import prom, views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prom.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/", include("akri_site.dashboard.accounts")),
    path("api/", include("akri_site.dashboard.api")),
    # Queue charges: the admission webhook (no session, no CSRF; not where the pages are
    # served in production: AKRI_WEB_ROLE), the Queues pages and API.
    *([path("webhooks/", include("agent.queues.urls"))] if settings.AKRI_WEB_ROLE == "all" else []),
    path("queues/", include("agent.queues.pages")),
    path("api/queues/", include((api_urlpatterns, "queues_api"))),
    path("", include("agent.brokers.urls")),
    path("", include("akri_site.dashboard.urls")),
]
