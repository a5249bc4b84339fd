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

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from akri_site.dashboard.access import can_view
from akri_site.dashboard.tokens import HashedTokenAuthentication

# Tokens are checked against their stored hashes (``tokens``): DRF's own model kept them in clear.
AUTHENTICATION = [HashedTokenAuthentication, SessionAuthentication]


class IsViewer(BasePermission):
    message = "You need the viewer, operator or admin role."

    def has_permission(self, request: Any, view: Any) -> bool:
        return can_view(request.user)


class ApiView(APIView):
    """A JSON endpoint of the API that no viewset serves: the same sign-in and role as the
    viewsets. In the OpenAPI schema too (a script reads the charts and the queues as it reads
    the lists); each endpoint names its parameters with ``extend_schema``."""

    authentication_classes = AUTHENTICATION
    permission_classes = [IsViewer]
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()


def query(name: str, description: str, *, enum: Any = None, kind: Any = None) -> Any:
    """One optional query parameter of an ``ApiView`` endpoint, for its ``extend_schema``."""
    return OpenApiParameter(
        name,
        kind or OpenApiTypes.STR,
        OpenApiParameter.QUERY,
        required=False,
        description=description,
        enum=list(enum) if enum is not None else None,
    )


# What an ``ApiView`` endpoint answers: a JSON object, or a 400 naming the bad parameters.
JSON_OBJECT = {200: OpenApiTypes.OBJECT, 400: OpenApiTypes.OBJECT}
