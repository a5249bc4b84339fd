"""The node agent's URLs (``AKRI_AGENT_ONLY``): none. It serves no pages (see settings); its
``/metrics`` is prometheus_client's own small server (``agent.exporter``), not Django."""

urlpatterns: list = []
