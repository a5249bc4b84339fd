"""``{% leaders_card %}``: who leads the controller replicas and Celery beat (agent.leader)."""

from django import template

from agent.leader.status import leaders

register = template.Library()


@register.inclusion_tag("dashboard/_leaders.html")
def leaders_card() -> dict:
    return {"leaders": leaders()}
