"""The read-only JSON API: every list the pages show, for scripts and the HTTP fallback.

Configured per view (session or token auth, viewer role, pagination, django-filter) so that it
needs no project-wide ``REST_FRAMEWORK`` settings; the sign-in and the role check are
``apiauth``'s, shared with every other endpoint under ``/api/``. OpenAPI schema at
``/api/schema/``.

Scripts sign in with a token of their user (``Authorization: Token <key>``; stored hashed,
expiring, see ``tokens``; made with ``manage.py apitoken`` or in the admin); a token carries
exactly its user's role. As on the
pages, a query parameter the endpoint does not know, a node name nothing knows or an
``ordering`` field that is not offered is a 400 naming it: a typo must not read as "no rows".
Interactive documentation (Swagger UI, from static files) at ``/api/docs/``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.urls import path
from django_filters import rest_framework as filters
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.pagination import PageNumberPagination
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.routers import APIRootView, DefaultRouter

from agent.models import Configuration, Instance, Node, ReconcileRun, Slot, SlotEvent
from akri_site.dashboard import charts
from akri_site.dashboard.apiauth import AUTHENTICATION, IsViewer
from akri_site.dashboard.cordoning import CordonListView
from akri_site.dashboard.forms import UtcIsoDateTimeField, known_nodes
from akri_site.dashboard.queries import RUN_FIELDS
from akri_site.dashboard.slotmap import HELD_LEVELS, STUCK_STATES, StuckRules, slot_state


class Pagination(PageNumberPagination):
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


class ConfigurationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Configuration
        fields = [
            "id",
            "namespace",
            "name",
            "uid",
            "resource_version",
            "generation",
            "capacity",
            "unique_devices",
            "discovery_handler",
            "error",
            "deleting",
            "created_at",
            "updated_at",
            "spec",
        ]


class InstanceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Instance
        fields = [
            "id",
            "namespace",
            "name",
            "uid",
            "resource_version",
            "configuration_name",
            "cdi_name",
            "capacity",
            "shared",
            "nodes",
            "broker_properties",
            "device_usage",
            "cordon",
            "deleting",
            "created_at",
            "updated_at",
        ]


class SlotSerializer(serializers.ModelSerializer):
    namespace = serializers.CharField(source="instance.namespace", read_only=True)
    instance_name = serializers.CharField(source="instance.name", read_only=True)
    configuration = serializers.CharField(source="instance.configuration_name", read_only=True)
    state = serializers.SerializerMethodField()

    class Meta:
        model = Slot
        fields = [
            "id",
            "namespace",
            "instance_name",
            "configuration",
            "key",
            "index",
            "value",
            "level",
            "state",
            "holder_node",
            "vdev",
            "surplus",
            "since",
            "pod_namespace",
            "pod_name",
            "pod_uid",
            "container",
        ]

    def get_state(self, slot: Slot) -> str:
        return slot_state(slot.level)


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = ["id", "name", "ready", "ready_since", "not_ready_since", "labels", "deleted"]


class RunSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReconcileRun
        fields = list(RUN_FIELDS)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = SlotEvent
        fields = [
            "id",
            "at",
            "namespace",
            "instance",
            "configuration",
            "slot",
            "before",
            "after",
            "cause",
            "actor",
            "node",
            "pod",
            "detail",
            "run",
        ]


# Parameters every list endpoint takes besides its filters.
COMMON_PARAMETERS = frozenset({"page", "page_size", "format", "ordering"})


class StrictFilterBackend(filters.DjangoFilterBackend):
    """django-filter, but a parameter that is no filter of the endpoint is a 400."""

    def filter_queryset(self, request: Any, queryset: QuerySet, view: Any) -> QuerySet:
        filterset_class = self.get_filterset_class(view, queryset)
        known = set(filterset_class.base_filters) if filterset_class else set()
        unknown = sorted(set(request.query_params) - known - COMMON_PARAMETERS)
        if unknown:
            offered = ", ".join(sorted(known | COMMON_PARAMETERS))
            raise ValidationError(
                {name: [f"Unknown parameter; this endpoint takes: {offered}."] for name in unknown}
            )
        return super().filter_queryset(request, queryset, view)


class StrictOrdering(OrderingFilter):
    """``?ordering=field,-other`` over the view's ``ordering_fields``; anything else is a 400.
    The id breaks ties, so pages stay stable."""

    def remove_invalid_fields(self, queryset: QuerySet, fields: Any, view: Any, request: Any):
        allowed = set(view.ordering_fields)
        bad = [f for f in fields if f.lstrip("-") not in allowed]
        if bad:
            offered = ", ".join(sorted(allowed))
            raise ValidationError(
                {"ordering": [f"Cannot order by {', '.join(bad)}; choose from: {offered}."]}
            )
        return [*fields, "id"] if "id" not in {f.lstrip("-") for f in fields} else list(fields)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """The schema names the fields offered (``a,-b``: a comma-separated list)."""
        fields = list(view.ordering_fields)
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": "Fields to order by, comma-separated, `-` for descending "
                f"(the id breaks ties): {', '.join(fields)}.",
                "schema": {
                    "type": "array",
                    "items": {"type": "string", "enum": [*fields, *(f"-{f}" for f in fields)]},
                },
                "style": "form",
                "explode": False,
            }
        ]


class _NodeForm(forms.Form):
    """Filters naming a node: an unknown node is an error, as on the pages."""

    def clean_node(self) -> str:
        node = self.cleaned_data.get("node") or ""
        if node and node not in self.known_nodes():
            # A parameter, not an f-string: the message is %-formatted later, and a node name
            # with a "%" in it raised there (a 500).
            raise forms.ValidationError(
                "No node named “%(node)s” is known.", code="unknown", params={"node": node}
            )
        return node

    def known_nodes(self) -> set[str]:
        return known_nodes()


class _RunNodeForm(_NodeForm):
    def known_nodes(self) -> set[str]:
        ran = ReconcileRun.objects.order_by().values_list("node", flat=True).distinct()
        return known_nodes() | set(ran)


class _EventNodeForm(_NodeForm):
    def known_nodes(self) -> set[str]:
        seen = SlotEvent.objects.order_by().values_list("node", flat=True).distinct()
        return known_nodes() | set(seen)


class ConfigurationFilter(filters.FilterSet):
    has_error = filters.BooleanFilter(method="filter_has_error")

    class Meta:
        model = Configuration
        fields = ["namespace", "name", "discovery_handler", "deleting"]

    def filter_has_error(self, qs: QuerySet, name: str, value: bool) -> QuerySet:
        return qs.exclude(error="") if value else qs.filter(error="")


class InstanceFilter(filters.FilterSet):
    configuration = filters.CharFilter(field_name="configuration_name")

    class Meta:
        model = Instance
        fields = ["namespace", "name", "configuration", "shared", "deleting"]


class SlotFilter(filters.FilterSet):
    STATES = (
        ("free", "free"),
        ("held", "held"),
        ("foreign", "foreign"),
        ("surplus", "surplus"),
        *((kind, kind) for kind in STUCK_STATES if kind != "foreign"),
    )
    state = filters.ChoiceFilter(choices=STATES, method="filter_state")
    level = filters.ChoiceFilter(choices=Slot.Level.choices)
    node = filters.CharFilter(field_name="holder_node")
    namespace = filters.CharFilter(field_name="instance__namespace")
    instance = filters.CharFilter(field_name="instance__name")
    configuration = filters.CharFilter(field_name="instance__configuration_name")
    pod = filters.CharFilter(field_name="pod_name")

    class Meta:
        model = Slot
        form = _NodeForm
        fields = [
            "state",
            "level",
            "node",
            "namespace",
            "instance",
            "configuration",
            "surplus",
            "pod_namespace",
            "pod",
            "pod_uid",
        ]

    def filter_state(self, qs: QuerySet, name: str, value: str) -> QuerySet:
        if value == "surplus":
            return qs.filter(surplus=True)
        if value in STUCK_STATES and value != "foreign":
            return qs.filter(StuckRules.at().query(value))
        if value == "held":
            return qs.filter(level__in=HELD_LEVELS)
        return qs.filter(level=Slot.Level.FOREIGN if value == "foreign" else Slot.Level.FREE)


class NodeFilter(filters.FilterSet):
    class Meta:
        model = Node
        fields = ["name", "ready", "deleted"]


class UtcIsoDateTimeFilter(filters.IsoDateTimeFilter):
    """An ISO 8601 time filter whose value reaches the query in UTC (``forms.as_utc``)."""

    field_class = UtcIsoDateTimeField


class RunFilter(filters.FilterSet):
    scope = filters.ChoiceFilter(choices=ReconcileRun.Scope.choices)
    trigger = filters.ChoiceFilter(choices=ReconcileRun.Trigger.choices)
    started_after = UtcIsoDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = UtcIsoDateTimeFilter(field_name="started_at", lookup_expr="lt")
    changed = filters.BooleanFilter(method="filter_changed")

    class Meta:
        model = ReconcileRun
        form = _RunNodeForm
        fields = ["scope", "trigger", "node", "task_id"]

    def filter_changed(self, qs: QuerySet, name: str, value: bool) -> QuerySet:
        changed = Q(released__gt=0) | Q(restored__gt=0)
        return qs.filter(changed) if value else qs.exclude(changed)


class EventFilter(filters.FilterSet):
    cause = filters.ChoiceFilter(choices=SlotEvent.Cause.choices)
    # Not "after"/"before": those are the slot's values around the change.
    at_after = UtcIsoDateTimeFilter(field_name="at", lookup_expr="gte")
    at_before = UtcIsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = SlotEvent
        form = _EventNodeForm
        fields = ["cause", "namespace", "instance", "configuration", "slot", "node", "actor", "run"]


class _ReadOnly(viewsets.ReadOnlyModelViewSet):
    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    pagination_class = Pagination
    filter_backends = [StrictFilterBackend, StrictOrdering]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    schema = AutoSchema()


class ConfigurationViewSet(_ReadOnly):
    queryset = Configuration.objects.order_by("namespace", "name")
    serializer_class = ConfigurationSerializer
    filterset_class = ConfigurationFilter
    ordering_fields = ["namespace", "name", "capacity", "created_at", "updated_at"]


class InstanceViewSet(_ReadOnly):
    queryset = Instance.objects.order_by("namespace", "name")
    serializer_class = InstanceSerializer
    filterset_class = InstanceFilter
    ordering_fields = ["namespace", "name", "configuration_name", "capacity", "updated_at"]


class SlotViewSet(_ReadOnly):
    queryset = Slot.objects.select_related("instance").order_by("instance_id", "index", "id")
    serializer_class = SlotSerializer
    filterset_class = SlotFilter
    ordering_fields = ["key", "index", "level", "holder_node", "since", "pod_name"]


class NodeViewSet(_ReadOnly):
    queryset = Node.objects.order_by("name")
    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    ordering_fields = ["name", "ready", "ready_since", "not_ready_since"]


class RunViewSet(_ReadOnly):
    queryset = ReconcileRun.objects.order_by("-started_at", "-id")
    serializer_class = RunSerializer
    filterset_class = RunFilter
    ordering_fields = ["started_at", "duration_ms", "checked", "released", "conflicts", "errors"]


class EventViewSet(_ReadOnly):
    queryset = SlotEvent.objects.order_by("-at", "-id")
    serializer_class = EventSerializer
    filterset_class = EventFilter
    ordering_fields = ["at", "slot", "instance", "cause", "node"]


class SchemaView(SpectacularAPIView):
    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    schema = None  # not part of the API it describes
    custom_settings = {
        "TITLE": "akri-site API",
        "DESCRIPTION": "Read-only view of the akri-site cluster cache and its history.",
        "VERSION": "1",
    }


class DocsView(SpectacularSwaggerSplitView):
    """``/api/docs/``: Swagger UI over ``/api/schema/``, same sign-in as the API. The split view
    serves its start-up script from ``?script`` rather than inline, so the site's
    Content-Security-Policy holds here too."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    schema = None
    template_name = "dashboard/api_docs.html"
    title = "akri-site API"
    url_name = "api:schema"


class ApiRoot(APIRootView):
    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    schema = None


class Router(DefaultRouter):
    APIRootView = ApiRoot


router = Router()
router.register("configurations", ConfigurationViewSet, basename="configuration")
router.register("instances", InstanceViewSet, basename="instance")
router.register("slots", SlotViewSet, basename="slot")
router.register("nodes", NodeViewSet, basename="node")
router.register("runs", RunViewSet, basename="run")
router.register("events", EventViewSet, basename="event")

app_name = "api"
urlpatterns = [
    path("schema/", SchemaView.as_view(), name="schema"),
    path("charts/usage/", charts.UsageView.as_view(), name="chart-usage"),
    path(
        "charts/release-latency/", charts.ReleaseLatencyView.as_view(), name="chart-release-latency"
    ),
    path("docs/", DocsView.as_view(), name="docs"),
    path("cordons/", CordonListView.as_view(), name="cordons"),
    *router.urls,
]
