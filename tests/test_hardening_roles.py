"""``grantrole`` leaves a user with exactly one role's rights (issue #12, item 1)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from akri_site.dashboard.access import can_release, role_of

pytestmark = pytest.mark.django_db


def _grant(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("grantrole", *args, stdout=out)
    return out.getvalue().splitlines()


def test_it_demotes_a_superuser_granted_the_viewer_role():
    User.objects.create_superuser("root", password="x" * 12)

    lines = _grant("root", "viewer")

    assert lines[-1] == "root: role viewer, staff=no"
    assert "root: removed superuser" in lines and "root: removed staff" in lines
    root = User.objects.get(username="root")
    assert not root.is_superuser and not root.is_staff
    assert role_of(root) == "viewer"
    assert not root.has_perm("agent.release_slot") and not can_release(root)


def test_it_removes_permissions_granted_directly_and_other_roles():
    _grant("olga", "operator", "--create")
    olga = User.objects.get(username="olga")
    olga.user_permissions.add(Permission.objects.get(codename="change_user"))

    lines = _grant("olga", "viewer")

    assert "olga: removed role operator" in lines and "olga: added role viewer" in lines
    assert "olga: removed permissions granted directly: change_user" in lines
    olga = User.objects.get(username="olga")
    assert list(olga.groups.values_list("name", flat=True)) == ["viewer"]
    assert not olga.has_perm("auth.change_user") and not olga.is_staff


def test_an_admin_is_staff_but_not_superuser():
    User.objects.create_superuser("ada", password="x" * 12)

    _grant("ada", "admin")

    ada = User.objects.get(username="ada")
    assert ada.is_staff and not ada.is_superuser and role_of(ada) == "admin"
    assert can_release(ada)


def test_role_none_leaves_no_rights():
    _grant("bob", "admin", "--create")

    lines = _grant("bob", "none")

    assert "bob: removed role admin" in lines
    bob = User.objects.get(username="bob")
    assert role_of(bob) is None and not bob.is_staff


def test_it_says_nothing_changed_when_nothing_did():
    _grant("eve", "viewer", "--create")

    assert _grant("eve", "viewer") == ["eve: role viewer, staff=no"]
