from django.contrib import admin
from django.urls import include, path

from akri_site.dashboard import prom, views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("metrics", prom.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("accounts/", include("akri_site.dashboard.accounts")),
    path("api/", include("akri_site.dashboard.api")),
    path("", include("agent.brokers.urls")),
    path("", include("akri_site.dashboard.urls")),
]
