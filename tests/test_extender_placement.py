"""kube-scheduler's node rules that the extender's bind checks again (agent.extender.placement):
nodeSelector, required node affinity, taints and cordons, as component-helpers decides them."""

from __future__ import annotations

import pytest

from agent.extender.placement import refusal


def node(name="n1", labels=None, taints=None, unschedulable=False) -> dict:
    spec: dict = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pod(selector=None, terms=None, tolerations=None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        required = {"nodeSelectorTerms": terms}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"metadata": {"name": "p", "namespace": "kube-system"}, "spec": spec}


def expr(key, operator, *values) -> dict:
    found = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


def test_a_pod_with_no_rules_goes_anywhere_untainted():
    assert refusal(pod(), node()) == ""


def test_the_node_selector_must_match_every_label():
    selected = pod({"disk": "ssd", "zone": "a"})

    assert refusal(selected, node(labels={"disk": "ssd", "zone": "a", "x": "y"})) == ""
    assert refusal(selected, node(labels={"disk": "ssd"})) == (
        "node n1 does not match the pod's nodeSelector (zone=a)"
    )


@pytest.mark.parametrize(
    "requirement, labels, fits",
    [
        (expr("zone", "In", "a", "b"), {"zone": "b"}, True),
        (expr("zone", "In", "a", "b"), {"zone": "c"}, False),
        (expr("zone", "In", "a"), {}, False),
        (expr("zone", "NotIn", "a"), {"zone": "b"}, True),
        (expr("zone", "NotIn", "a"), {}, True),
        (expr("zone", "NotIn", "a"), {"zone": "a"}, False),
        (expr("gpu", "Exists"), {"gpu": ""}, True),
        (expr("gpu", "Exists"), {}, False),
        (expr("gpu", "DoesNotExist"), {}, True),
        (expr("gpu", "DoesNotExist"), {"gpu": "1"}, False),
        (expr("cores", "Gt", "8"), {"cores": "16"}, True),
        (expr("cores", "Gt", "8"), {"cores": "8"}, False),
        (expr("cores", "Lt", "8"), {"cores": "4"}, True),
        (expr("cores", "Lt", "8"), {"cores": "many"}, False),
        (expr("cores", "Gt", "8"), {}, False),
        (expr("zone", "Near", "a"), {"zone": "a"}, False),
    ],
)
def test_each_operator_of_a_node_selector_requirement(requirement, labels, fits):
    found = refusal(pod(terms=[{"matchExpressions": [requirement]}]), node(labels=labels))

    assert (found == "") is fits, found


def test_terms_are_ored_and_requirements_of_a_term_anded():
    terms = [
        {"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "Exists")]},
        {"matchExpressions": [expr("zone", "In", "b")]},
    ]

    assert refusal(pod(terms=terms), node(labels={"zone": "a", "gpu": "1"})) == ""
    assert refusal(pod(terms=terms), node(labels={"zone": "b"})) == ""
    assert refusal(pod(terms=terms), node(labels={"zone": "a"})) == (
        "node n1 does not match the pod's required node affinity"
    )


def test_an_empty_term_or_no_term_matches_no_node():
    assert refusal(pod(terms=[{}]), node()) != ""
    assert refusal(pod(terms=[]), node()) != ""


def test_match_fields_name_the_node():
    by_name = [{"matchFields": [expr("metadata.name", "In", "n2")]}]

    assert refusal(pod(terms=by_name), node("n2")) == ""
    assert refusal(pod(terms=by_name), node("n1")) != ""
    other_field = [{"matchFields": [expr("metadata.uid", "In", "n1")]}]
    assert refusal(pod(terms=other_field), node("n1")) != ""


@pytest.mark.parametrize(
    "toleration, tolerated",
    [
        ({"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "yes"}, True),  # operator Equal and any effect by default
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates everything
        ({"key": "gpu", "value": "no"}, False),
        ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_no_schedule_taint_needs_a_toleration(toleration, tolerated):
    tainted = node(taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}])

    found = refusal(pod(tolerations=[toleration]), tainted)

    assert (found == "") is tolerated, found


def test_prefer_no_schedule_only_scores_and_no_execute_refuses():
    soft = node(taints=[{"key": "busy", "effect": "PreferNoSchedule"}])
    hard = node(taints=[{"key": "dying", "effect": "NoExecute"}])

    assert refusal(pod(), soft) == ""
    assert refusal(pod(), hard) == (
        "node n1 has the taint dying=:NoExecute, which the pod does not tolerate"
    )


def test_a_cordoned_node_takes_only_pods_that_tolerate_it():
    cordoned = node(unschedulable=True)
    tolerant = pod(
        tolerations=[
            {
                "key": "node.kubernetes.io/unschedulable",
                "operator": "Exists",
                "effect": "NoSchedule",
            }
        ]
    )

    assert refusal(pod(), cordoned) == "node n1 is cordoned (unschedulable)"
    assert refusal(tolerant, cordoned) == ""


def test_garbage_in_the_objects_refuses_or_is_ignored_but_never_raises():
    junk = {
        "metadata": {"name": "p"},
        "spec": {"nodeSelector": "x", "affinity": [], "tolerations": 3},
    }

    assert refusal(junk, {"metadata": None, "spec": {"taints": ["x", {"effect": 1}]}}) == ""
    assert refusal(pod(terms="nonsense"), node()) != ""
