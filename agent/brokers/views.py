"""The Instance page's broker block on its own, for the page to refresh it while open."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.brokers import queries
from agent.models import Instance
from akri_site.dashboard.access import viewer_required


@require_GET
@never_cache
@viewer_required
def instance_fragment(request: HttpRequest, namespace: str, name: str) -> HttpResponse:
    row = get_object_or_404(Instance, namespace=namespace, name=name)
    context = queries.instance_brokers(namespace, name, row.configuration_name)
    context.update(instance=row, refresh_url=request.path, fragment=True)
    return render(request, "brokers/_instance.html", context)
