from django.urls import path

from agent.queues import views

app_name = "queues"

urlpatterns = [
    path("", views.queues, name="queues"),
    # <path:>, not <str:>: a queue name is what the queue system allows, "/" included (a
    # Volcano queue named "a/b" made every page linking to it a 500).
    path("q/<path:queue>/", views.queue_detail, name="queue"),
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
