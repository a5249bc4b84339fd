from django.urls import path

from agent.brokers import views

app_name = "brokers"
urlpatterns = [
    path(
        "brokers/instances/<str:namespace>/<str:name>/",
        views.instance_fragment,
        name="instance",
    ),
]
