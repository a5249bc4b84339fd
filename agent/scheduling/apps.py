from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "agent.scheduling"
    label = "scheduling"
    verbose_name = "Scheduling verdicts"
