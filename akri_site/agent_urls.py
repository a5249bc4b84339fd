"""The node agent's URLs (``AKRI_AGENT_ONLY``): none, it serves no HTTP (see settings)."""

urlpatterns: list = []
