from django.urls import path

from akri_site.dashboard import (
    cordoning,
    draining,
    evicting,
    finding,
    lists,
    releasing,
    scheduling,
    views,
)

app_name = "dashboard"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("slots/", views.slot_map, name="slots"),
    # A list per kind (issue 31); each object's own page is below.
    path("configurations/", lists.configurations, name="configurations"),
    path("instances/", lists.instances, name="instances"),
    path("nodes/", lists.nodes, name="nodes"),
    path("pods/", lists.pods, name="pods"),
    path("brokers/", lists.brokers, name="brokers"),
    path("slots/<int:pk>/release/", releasing.release_slot, name="release"),
    path("search/", finding.search, name="search"),
    path("pods/<str:namespace>/<str:name>/", finding.pod_detail, name="pod"),
    path("pods/<str:namespace>/<str:name>/evict/", evicting.evict_pod, name="evict"),
    path("instances/<str:namespace>/<str:name>/", views.instance_detail, name="instance"),
    # JSON for scripts (token or session): the API under /api/ stays read-only.
    path(
        "instances/<str:namespace>/<str:name>/cordon/",
        cordoning.CordonView.as_view(),
        name="cordon",
    ),
    path(
        "instances/<str:namespace>/<str:name>/drain/",
        draining.instance_drain,
        name="instance-drain",
    ),
    path(
        "configurations/<str:namespace>/<str:name>/",
        views.configuration_detail,
        name="configuration",
    ),
    path(
        "configurations/<str:namespace>/<str:name>/yaml/",
        finding.configuration_yaml,
        name="configuration-yaml",
    ),
    path("instances/<str:namespace>/<str:name>/yaml/", finding.instance_yaml, name="instance-yaml"),
    path("nodes/<str:name>/", views.node_detail, name="node"),
    path("reconciliation/", views.runs, name="runs"),
    path("reconciliation/<int:pk>/", views.run_detail, name="run"),
    path("audit/", views.audit, name="audit"),
    path("scheduling/", scheduling.pending, name="scheduling"),
]
