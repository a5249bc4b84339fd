"""``{% instance_brokers instance %}`` and ``{% configuration_brokers configuration %}``: the
broker blocks of the Instance and Configuration pages (the pages' views stay as they are)."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse

from agent.brokers import queries

register = template.Library()


@register.inclusion_tag("brokers/_instance.html")
def instance_brokers(instance: Any) -> dict[str, Any]:
    context = queries.instance_brokers(
        instance.namespace, instance.name, instance.configuration_name
    )
    context["refresh_url"] = reverse("brokers:instance", args=[instance.namespace, instance.name])
    context["instance"] = instance
    return context


@register.inclusion_tag("brokers/_configuration.html")
def configuration_brokers(configuration: Any) -> dict[str, Any]:
    context = queries.configuration_brokers(configuration.namespace, configuration.name)
    context["configuration"] = configuration
    return context
