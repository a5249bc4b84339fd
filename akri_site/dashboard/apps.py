from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate, post_save


class DashboardConfig(AppConfig):
    name = "akri_site.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        from akri_site.dashboard import checks  # noqa: F401  (registers the deploy checks)
        from akri_site.dashboard.access import ensure_roles

        # post_migrate is sent only for apps with models, so listen for the agent's: by then
        # its permissions exist (auth's handler was connected first). Also sent by ``flush``,
        # which transactional tests run between tests.
        post_migrate.connect(
            ensure_roles, sender=apps.get_app_config("agent"), dispatch_uid="akri-dashboard-roles"
        )
        from agent.models import AuditEntry
        from akri_site.dashboard.live import audit_entry_saved

        post_save.connect(
            audit_entry_saved, sender=AuditEntry, dispatch_uid="akri-dashboard-audit-live"
        )
        from agent import bench

        bench.register(
            "slotmap",
            "akri_site.dashboard.bench",
            "bench_slotmap",
            "server time of the slot map, 2,000 Instances x 4 slots (target 500 ms)",
        )
