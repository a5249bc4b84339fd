from django.apps import AppConfig


class BrokersConfig(AppConfig):
    name = "agent.brokers"
    label = "brokers"
    verbose_name = "Broker deployment"
    default_auto_field = "django.db.models.BigAutoField"
