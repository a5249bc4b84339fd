from django.urls import path

from agent.queues import webhook

app_name = "queues_webhooks"

urlpatterns = [
    path("pods/validate", webhook.validate, name="pods-validate"),
]
