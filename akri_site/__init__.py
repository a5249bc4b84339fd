from akri_site import env
from akri_site.env import one_line_for_bad_settings

# First, so that a bad setting read while the Celery app loads is one line too.
one_line_for_bad_settings()

# The node agent's process (AKRI_AGENT_ONLY, as its DaemonSet runs it) sends no tasks: without
# the Celery app it does not load Celery, kombu and billiard, about 20 MB of every agent.
if not env.boolean("AKRI_AGENT_ONLY", False):
    from akri_site.celery import app as celery_app  # noqa: F401
else:
    # Nor the parts of the Kubernetes client and of Django it never uses (akri_site.deferred):
    # deferred before anything imports them.
    from akri_site import deferred

    deferred.defer()

__all__ = ("celery_app",)
