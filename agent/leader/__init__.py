"""Lease-based leader election for the controller replicas and Celery beat."""

CONTROLLER_LEASE = "akri-site-controller"
BEAT_LEASE = "akri-site-beat"
# Shown on the dashboard, in this order.
LEASES = {"controller": CONTROLLER_LEASE, "beat": BEAT_LEASE}


def configured_timing():
    """The Timing from settings; a bad combination is an error at start-up."""
    from django.conf import settings

    from agent.domain.lease import Timing

    conf = settings.LEADER_ELECTION
    try:
        return Timing(conf["LEASE_DURATION"], conf["RENEW_DEADLINE"], conf["RETRY_PERIOD"])
    except ValueError as exc:
        from akri_site.env import EnvError

        raise EnvError(
            f"AKRI_LEASE_DURATION / AKRI_LEASE_RENEW_DEADLINE / AKRI_LEASE_RETRY_PERIOD: {exc}"
        ) from None
