"""Why pods wait: the scheduler extender's last verdict per pod, in words (issue 14).

The extender (``runextender``) writes one ``PodVerdict`` per pod it filters; these views only
read them. The node page's part is ``agent.scheduling.queries.node_context``.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agent.scheduling.models import PodVerdict
from akri_site.dashboard import sorting
from akri_site.dashboard.access import viewer_required
from akri_site.dashboard.views import page_context

PAGE = 50


@require_GET
@viewer_required
@sorting.sortable(sorting.SCHEDULING)
def pending(request: HttpRequest) -> HttpResponse:
    waiting = request.GET.get("show") != "all"
    sort = request.sorts["sort"]
    qs = sort.apply(PodVerdict.objects.all(), "namespace", "name", "id")
    if waiting:
        qs = qs.filter(bound_to="", fits=0)
    page = Paginator(qs, PAGE).get_page(request.GET.get("page"))
    context = page_context(
        request,
        page=page,
        waiting=waiting,
        sort_param="" if sort.is_default else sort.value,
    )
    return render(request, "dashboard/scheduling.html", context)
