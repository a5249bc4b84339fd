"""Websocket routes, mounted by ``akri_site.asgi`` behind the origin check and session auth."""

from django.urls import path

from agent.queues.live import QueuesConsumer
from akri_site.dashboard.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/queues/", QueuesConsumer.as_asgi()),
]
