"""The Django admin as the operator's escape hatch.

Everything here mirrors the API server or records history, so nothing is edited in place:
the cache is not the authority (a change here would be overwritten by the next watch event
and would lie until then), and history is append-only. The one write is **Release selected
slots**, which goes through the claim store's conditional release, names each slot and its
holder on a confirmation page, re-checks on the server that the slot still holds the value the
operator saw, and is audited whatever happens.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from agent import release
from agent.models import (
    AuditEntry,
    Configuration,
    Instance,
    Node,
    Pod,
    ReconcileRun,
    Slot,
    SlotEvent,
    SlotPodBinding,
    SyncState,
)
from agent.release import RELEASE_MAX, RELEASE_PERMISSION

admin.site.site_header = "akri-site administration"
admin.site.site_title = "akri-site admin"
admin.site.index_title = "Cluster cache, history and manual actions"


class SafeChangeList(ChangeList):
    """A change list whose date drill-down refuses impossible dates like other bad lookups.

    Django turns ``?at__year=abc`` into its bad-lookup page but lets an overflowing year
    (``9223372036854775808``) or the year after 9999 escape as a 500.
    """

    def get_filters(self, request: HttpRequest) -> Any:
        try:
            return super().get_filters(request)
        except (OverflowError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc


# Primary keys are 64-bit; anything else in a selection is forged or corrupt.
PK_MAX = 2**63 - 1


def _valid_selection(values: list[str]) -> bool:
    return all(v.isascii() and v.isdigit() and 0 < int(v) <= PK_MAX for v in values)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by whoever has the view permission; never added, changed or deleted here."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return SafeChangeList

    def response_action(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        # Django filters by the posted ids as they come: "abc" would be a 500 at the database.
        if not _valid_selection(request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)):
            return HttpResponseBadRequest(
                "Bad selection: slot ids are positive whole numbers.", content_type="text/plain"
            )
        return super().response_action(request, queryset)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Configuration)
class ConfigurationAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "namespace",
        "capacity",
        "unique_devices",
        "discovery_handler",
        "status",
        "updated_at",
    ]
    list_filter = ["namespace", "discovery_handler", "unique_devices", "deleting"]
    search_fields = ["name", "namespace", "discovery_handler", "error"]

    @admin.display(description="status")
    def status(self, obj: Configuration) -> str:
        return f"✖ error: {obj.error[:80]}" if obj.error else "✓ valid"


@admin.register(Instance)
class InstanceAdmin(ReadOnlyAdmin):
    list_display = ["name", "namespace", "configuration_name", "capacity", "shared", "node_list"]
    list_filter = ["namespace", "configuration_name", "shared", "deleting"]
    search_fields = ["name", "namespace", "configuration_name", "cdi_name"]

    @admin.display(description="nodes")
    def node_list(self, obj: Instance) -> str:
        return ", ".join(obj.nodes or []) or "—"


@admin.register(Slot)
class SlotAdmin(ReadOnlyAdmin):
    list_display = ["key", "state", "holder_node", "pod", "since", "instance_link"]
    list_per_page = 100
    list_filter = ["level", "surplus", "instance__configuration_name", "holder_node"]
    search_fields = ["key", "value", "holder_node", "pod_name", "instance__name"]
    list_select_related = ["instance"]
    actions = ["release_slots"]

    @admin.display(description="instance", ordering="instance__name")
    def instance_link(self, obj: Slot) -> str:
        url = reverse("dashboard:instance", args=[obj.instance.namespace, obj.instance.name])
        return format_html('<a href="{}">{}</a>', url, obj.instance.name)

    @admin.display(description="configuration", ordering="instance__configuration_name")
    def configuration(self, obj: Slot) -> str:
        return obj.instance.configuration_name

    @admin.display(description="state")
    def state(self, obj: Slot) -> str:
        if obj.level == Slot.Level.FREE:
            return "○ free"
        if obj.level == Slot.Level.FOREIGN:
            return f"⚠ foreign {obj.value!r}"
        return f"● held {obj.value}"

    @admin.display(description="pod")
    def pod(self, obj: Slot) -> str:
        if not obj.pod_name:
            return "—"
        pod = f"{obj.pod_namespace}/{obj.pod_name}"
        return f"{pod} / {obj.container}" if obj.container else pod

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RELEASE_PERMISSION)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # Django drops an action the user may not run without a word: a forged release is
        # refused all the same, and audited like every manual action.
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        if (
            request.method == "POST"
            and request.POST.get("action") == "release_slots"
            and not self.has_release_permission(request)
            and _valid_selection(selected)
        ):
            reason = request.POST.get("reason", "").strip()[: release.REASON_MAX]
            chosen = Slot.objects.filter(pk__in=selected[:RELEASE_MAX]).select_related("instance")
            for slot in chosen:
                target = f"{slot.instance.namespace}/{slot.instance.name}/{slot.key}"
                release.audit_refusal(
                    request.user, target, slot.value, reason, "needs the operator role"
                )
        return super().changelist_view(request, extra_context)

    def get_urls(self) -> list:
        urls = [
            path(
                "<int:pk>/release/",
                self.admin_site.admin_view(self.release_view),
                name="agent_slot_release",
            )
        ]
        return urls + super().get_urls()

    def release_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The confirmation page for one slot (linked from the dashboard's slot map)."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        get_object_or_404(Slot, pk=pk)
        return self._confirm(request, Slot.objects.filter(pk=pk))

    @admin.action(description="Release selected slots…", permissions=["release"])
    def release_slots(self, request: HttpRequest, queryset: QuerySet[Slot]) -> HttpResponse | None:
        # The action list already hides this from users without the permission; a forged
        # POST reaches here only if it names the action, so check again.
        if not self.has_release_permission(request):
            raise PermissionDenied
        if request.POST.get("post") == "yes":
            self._release(request, queryset)
            return None
        return self._confirm(request, queryset)

    def _confirm(self, request: HttpRequest, queryset: QuerySet[Slot]) -> HttpResponse:
        if queryset.count() > RELEASE_MAX:
            self.message_user(
                request,
                f"Select at most {RELEASE_MAX} slots to release at once.",
                messages.WARNING,
            )
            return HttpResponseRedirect(reverse("admin:agent_slot_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Release slots?",
            "opts": self.model._meta,
            **release.confirmation(queryset),
            "changelist_url": reverse("admin:agent_slot_changelist"),
        }
        return TemplateResponse(request, "admin/agent/slot/release_confirm.html", context)

    def _release(self, request: HttpRequest, queryset: QuerySet[Slot]) -> None:
        wanted = [
            int(v) for v in request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME) if v.isdigit()
        ]
        expected = {
            pk: request.POST[f"expected_{pk}"] for pk in wanted if f"expected_{pk}" in request.POST
        }
        outcomes = release.release(
            request.user, queryset, wanted, expected, request.POST.get("reason", "")
        )
        for level, text in release.report(outcomes):
            self.message_user(request, text, getattr(messages, level.upper()))


@admin.register(SlotEvent)
class SlotEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "slot", "before", "after", "cause", "actor", "node", "pod", "run"]
    list_filter = ["cause", "configuration", "node"]
    search_fields = ["slot", "instance", "actor", "pod", "detail", "before", "after"]
    date_hierarchy = "at"
    list_select_related = ["run"]


@admin.register(ReconcileRun)
class ReconcileRunAdmin(ReadOnlyAdmin):
    list_display = [
        "started_at",
        "scope",
        "node",
        "trigger",
        "duration_ms",
        "checked",
        "released",
        "restored",
        "conflicts",
        "errors",
        "task_id",
    ]
    list_filter = ["scope", "trigger", "node"]
    search_fields = ["node", "task_id", "detail"]
    date_hierarchy = "started_at"


@admin.register(SlotPodBinding)
class SlotPodBindingAdmin(ReadOnlyAdmin):
    list_display = ["node", "slot", "instance", "pod_namespace", "pod_name", "container", "seen_at"]
    list_filter = ["node", "namespace"]
    search_fields = ["slot", "instance", "pod_name", "pod_uid", "device_id"]


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["name", "ready", "ready_since", "not_ready_since", "deleted"]
    list_filter = ["ready", "deleted"]
    search_fields = ["name"]


@admin.register(Pod)
class PodAdmin(ReadOnlyAdmin):
    list_display = ["name", "namespace", "node_name", "phase", "deleting"]
    list_filter = ["phase", "deleting", "namespace"]
    search_fields = ["name", "namespace", "uid", "node_name"]


@admin.register(SyncState)
class SyncStateAdmin(ReadOnlyAdmin):
    list_display = ["owner", "kind", "resource_version", "relists", "synced_at"]
    search_fields = ["owner", "kind"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "username", "action", "target", "holder", "outcome", "reason"]
    list_filter = ["outcome", "action", "username"]
    search_fields = ["target", "username", "reason", "detail", "holder"]
    date_hierarchy = "at"
