"""The slot map selects in SQL exactly what its Python narrowing keeps (pages read one page)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.models import Instance, Slot, SlotEvent, SlotPodBinding
from akri_site.dashboard.sample import make_cluster
from akri_site.dashboard.slotmap import StuckRules, matching, narrow, serialize

pytestmark = pytest.mark.django_db

NODES = ("node-a", "node-b", "node-c")
VALUES = ["", "node-a", "node-b", "node-c", "C:v1:node-a", "C:v2:node-c", "weird"]


def python_side(filters: dict[str, str], rules: StuckRules | None = None) -> list[str]:
    everything = serialize(Instance.objects.all(), rules)
    return [i["key"] for i in everything if narrow(i, filters) is not None]


def sql_side(filters: dict[str, str], rules: StuckRules | None = None) -> list[str]:
    return [f"{i.namespace}/{i.name}" for i in matching(filters, rules)]


FILTERS = [
    {},
    *({"node": n} for n in (*NODES, "node-z")),
    *({"state": s} for s in ("held", "free", "foreign", "surplus")),
    *({"state": s} for s in ("stuck", "no-pod", "old", "conflict")),
    {"node": "node-a", "state": "stuck"},
    {"pod": "work-1"},
    {"pod": "apps/"},
    {"node": "node-b", "state": "free"},
    {"node": "node-a", "state": "held", "pod": "work"},
    {"node": "node-c", "state": "foreign"},
    {"q": "0000a", "node": "node-b"},
    {"configuration": "akri-onvif", "state": "surplus", "node": "node-a"},
]


@pytest.mark.parametrize(
    "filters", FILTERS, ids=lambda f: "&".join(f"{k}={v}" for k, v in f.items()) or "all"
)
def test_sql_and_python_agree_on_a_sample_cluster(filters):
    make_cluster(instances=24, capacity=4, nodes=NODES[:2])
    # Some variety: an Instance only node-c sees, one with no slots yet, a surplus slot.
    extra = Instance.objects.create(
        namespace="default", name="akri-onvif-lonely", configuration_name="akri-onvif",
        capacity=1, nodes=["node-c"],
    )  # fmt: skip
    Slot.objects.create(instance=extra, key="akri-onvif-lonely-0", index=0)
    Instance.objects.create(
        namespace="default", name="akri-onvif-empty", configuration_name="akri-onvif",
        capacity=2, nodes=["node-b", "node-c"],
    )  # fmt: skip
    Slot.objects.filter(key="akri-onvif-000003-3").update(surplus=True)

    assert sql_side(filters) == python_side(filters)


# A slot: its value, whether its pod is known, how long ago it changed (seconds; around the
# 20 s grace and the 24 h "held long" age, and exactly on them), and a recent conflict.
AGES = [0, 5, 19.5, 20, 20.5, 600, 86_399, 86_400, 86_401, 200_000]
slot_values = st.lists(
    st.tuples(st.sampled_from(VALUES), st.booleans(), st.sampled_from(AGES), st.booleans()),
    min_size=0,
    max_size=3,
)
instances = st.lists(
    st.tuples(slot_values, st.sets(st.sampled_from(NODES), max_size=3), st.booleans()),
    min_size=1,
    max_size=6,
)
STATES = ("", "held", "free", "foreign", "surplus", "stuck", "no-pod", "old", "conflict")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(instances=instances)
def test_sql_and_python_agree_on_any_cluster(instances):
    Instance.objects.all().delete()
    SlotEvent.objects.all().delete()
    SlotPodBinding.objects.all().delete()
    now = timezone.now()
    # Only node-a's slot-to-pod map is in this database: its slots alone can be "pod not known".
    SlotPodBinding.objects.create(
        node="node-a", slot="elsewhere-0", instance="x", namespace="default", allocated_at=now
    )
    for n, (values, nodes, surplus) in enumerate(instances):
        row = Instance.objects.create(
            namespace="default", name=f"inst-{n}", configuration_name="cams",
            capacity=len(values), nodes=sorted(nodes),
        )  # fmt: skip
        for i, (value, pod_known, age, conflict) in enumerate(values):
            level = (
                Slot.Level.FREE if not value
                else Slot.Level.CL if value.startswith("C:")
                else Slot.Level.FOREIGN if value == "weird"
                else Slot.Level.IL
            )  # fmt: skip
            holder = value.rsplit(":", 1)[-1] if level in (Slot.Level.IL, Slot.Level.CL) else ""
            Slot.objects.create(
                instance=row, key=f"inst-{n}-{i}", index=i, value=value, level=level,
                holder_node=holder, surplus=surplus and i == 0,
                pod_namespace="apps" if value and pod_known else "",
                pod_name=f"work-{n}" if value and pod_known else "",
                since=now - timedelta(seconds=age) if value else None,
            )  # fmt: skip
            if conflict:
                SlotEvent.objects.create(
                    at=now, namespace="default", instance=row.name, slot=f"inst-{n}-{i}",
                    cause=SlotEvent.Cause.CONFLICT, actor="test",
                )  # fmt: skip
    rules = StuckRules.at(now)
    for node, state, pod in itertools.product(("", *NODES), STATES, ("", "work-1")):
        filters = {k: v for k, v in (("node", node), ("state", state), ("pod", pod)) if v}
        assert sql_side(filters, rules) == python_side(filters, rules), filters
