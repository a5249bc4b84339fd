from django.urls import path

from agent.queues import views

app_name = "queues"

urlpatterns = [
    path("", views.queues, name="queues"),
    path("q/<str:queue>/", views.queue_detail, name="queue"),
    path("claims/<str:kind>/<str:namespace>/<str:name>/", views.claim_detail, name="claim"),
    path(
        "claims/<str:kind>/<str:namespace>/<str:name>/evict/",
        views.evict_foreign,
        name="evict",
    ),
]

api_urlpatterns = [
    path("", views.api_queues, name="api-queues"),
    path("charges/", views.api_charges, name="api-charges"),
    path("history/", views.api_history, name="api-history"),
]
