from django.apps import AppConfig


class QueuesConfig(AppConfig):
    """Queue charges (seed 003): DRA claims and queue-system objects in the cache, owners,
    charges and their history. The rules themselves are plain Python in ``agent.charges``."""

    name = "agent.queues"
    label = "queues"
    verbose_name = "Queue charges"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        from agent.charges.resolve import unknown_resolvers
        from agent.queues.review import label_key_problem

        unknown = unknown_resolvers(tuple(settings.AKRI_QUEUES["RESOLVERS"]))
        if unknown:
            raise ImproperlyConfigured(
                f"AKRI_QUEUE_RESOLVERS names unknown resolvers: {', '.join(unknown)}"
            )
        problem = label_key_problem(settings.AKRI_QUEUES["LABEL_KEY"])
        if problem:
            raise ImproperlyConfigured(problem)
