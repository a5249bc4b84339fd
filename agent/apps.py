from django.apps import AppConfig


class AgentConfig(AppConfig):
    name = "agent"
    verbose_name = "Cluster model and node agent"
