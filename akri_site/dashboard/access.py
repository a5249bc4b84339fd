"""Who may see and do what on the dashboard.

Three roles, held as Django groups created by ``agent/migrations/0002_roles.py``:

* ``viewer``   -- reads every page, the JSON API and the live feed;
* ``operator`` -- a viewer who may also release a slot by hand (``agent.release_slot``);
* ``admin``    -- everything (superusers count as admins).

Checks are on permissions rather than group names, so a permission granted directly to a user
works too. Every page calls these helpers first; templates only hide what the server refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

VIEW_PERMISSION = "agent.view_slot"
RELEASE_PERMISSION = "agent.release_slot"


def role_of(user: Any) -> str | None:
    """The highest role of ``user``, or ``None`` for anonymous users and outsiders."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser or user.groups.filter(name=ADMIN).exists():
        return ADMIN
    if user.has_perm(RELEASE_PERMISSION):
        return OPERATOR
    if user.has_perm(VIEW_PERMISSION):
        return VIEWER
    return None


def can_view(user: Any) -> bool:
    return role_of(user) is not None


def can_release(user: Any) -> bool:
    """May ``user`` release slots by hand (on the slot map or in the Django admin)? Staff only,
    so that both places agree on who may."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and user.is_staff
        and user.has_perm(RELEASE_PERMISSION)
    )


def viewer_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anonymous users go to the login page; signed-in users without a role get 403."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can_view(request.user):
            raise PermissionDenied("You are signed in but have no dashboard role.")
        return view(request, *args, **kwargs)

    return wrapper


def ensure_roles(using: str = "default", **kwargs: Any) -> None:
    """Create or complete the three groups; idempotent.

    Runs after every ``migrate`` and ``flush`` (``post_migrate``), so that roles exist on a
    fresh database, after tests flush it, and include permissions of models added later.
    """
    from django.contrib.auth.models import Group, Permission

    perms = Permission.objects.using(using)
    view = list(perms.filter(content_type__app_label="agent", codename__startswith="view_"))
    release = list(perms.filter(content_type__app_label="agent", codename="release_slot"))
    groups = Group.objects.using(using)
    groups.get_or_create(name=VIEWER)[0].permissions.add(*view)
    groups.get_or_create(name=OPERATOR)[0].permissions.add(*view, *release)
    groups.get_or_create(name=ADMIN)[0].permissions.add(*perms.all())
