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
        # And for this app's own: the admin role takes the API tokens' permissions too, which
        # exist only once this app (after the agent's) has migrated.
        post_migrate.connect(ensure_roles, sender=self, dispatch_uid="akri-dashboard-roles-own")
        from agent.models import AuditEntry
        from akri_site.dashboard.live import audit_entry_saved

        post_save.connect(
            audit_entry_saved, sender=AuditEntry, dispatch_uid="akri-dashboard-audit-live"
        )
        from axes.models import AccessAttempt
        from axes.signals import user_locked_out
        from django.db.models.signals import post_delete

        from akri_site.dashboard import lockout

        user_locked_out.connect(lockout.locked_out, dispatch_uid="akri-dashboard-lockout")
        post_delete.connect(
            lockout.attempt_deleted, sender=AccessAttempt, dispatch_uid="akri-dashboard-unlock"
        )
        from agent import bench

        bench.register(
            "slotmap",
            "akri_site.dashboard.bench",
            "bench_slotmap",
            "server time of the slot map, 2,000 Instances x 4 slots (target 500 ms)",
        )
