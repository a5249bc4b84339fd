"""How every endpoint of the JSON API (``/api/...``) signs its caller in and checks the role.

One place for it, below every module that serves the API (the viewsets of ``api``, the charts,
the queue charges of ``agent.queues``), so that an endpoint answers as the README says: a
per-user token (``Authorization: Token <key>``) or the dashboard's session, and the viewer role
or above. The token comes first, so that a request without credentials is a 401 naming the
scheme (``WWW-Authenticate: Token``) and a bad token a 401 rather than a 403; a signed-in user
or a good token without a role is a 403.
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from akri_site.dashboard.access import can_view

AUTHENTICATION = [TokenAuthentication, SessionAuthentication]


class IsViewer(BasePermission):
    message = "You need the viewer, operator or admin role."

    def has_permission(self, request: Any, view: Any) -> bool:
        return can_view(request.user)


class ApiView(APIView):
    """A JSON endpoint of the API that no viewset serves: the same sign-in and role as the
    viewsets. Left out of the OpenAPI schema, which describes the cache's lists."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    renderer_classes = [JSONRenderer]
    schema = None
