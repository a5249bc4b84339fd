from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "akri_site.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"
