"""``{% leaders_card %}``: who leads the controller replicas and Celery beat (agent.leader)."""

from django import template
from django.conf import settings

from agent.leader.status import leaders

register = template.Library()


@register.inclusion_tag("dashboard/_leaders.html")
def leaders_card() -> dict:
    # With election off (AKRI_LEADER_ELECTION=false: one replica each, as the demo runs them)
    # no Lease is ever written: "unknown" would read as a fault, so the card says so instead.
    if not settings.LEADER_ELECTION["ENABLED"]:
        return {"election_off": True, "leaders": []}
    return {"leaders": leaders()}
