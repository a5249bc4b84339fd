"""Dashboard roles as groups: viewer, operator (viewer + release a slot), admin (everything).

Permissions are normally created after ``migrate`` finishes (post_migrate); groups need them now,
so they are created here first. Running this twice changes nothing.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

AGENT_MODELS = (
    "configuration",
    "instance",
    "slot",
    "slotevent",
    "reconcilerun",
    "slotpodbinding",
    "node",
    "pod",
    "syncstate",
    "auditentry",
)


def _ensure_permissions(apps):
    for app_config in apps.get_app_configs():
        # Migration state apps have no models module; create_permissions skips such apps.
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None


def create_roles(apps, schema_editor):
    _ensure_permissions(apps)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = list(
        Permission.objects.filter(
            content_type__app_label="agent",
            codename__in=[f"view_{model}" for model in AGENT_MODELS],
        )
    )
    release = list(
        Permission.objects.filter(content_type__app_label="agent", codename="release_slot")
    )
    viewer, _ = Group.objects.get_or_create(name="viewer")
    viewer.permissions.add(*view)
    operator, _ = Group.objects.get_or_create(name="operator")
    operator.permissions.add(*view, *release)
    admin, _ = Group.objects.get_or_create(name="admin")
    admin.permissions.add(*Permission.objects.all())


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(
        name__in=["viewer", "operator", "admin"]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("agent", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
