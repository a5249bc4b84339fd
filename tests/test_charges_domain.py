"""The charge rules one at a time: queue resolvers, preemptibility, owners, orphans,
non-accounted resources, bad input, and the webhook's decisions."""

from __future__ import annotations

from agent.charges.admission import (
    ALLOW,
    Joined,
    admit_owner_label,
    admit_pod,
    owner_label_patch,
)
from agent.charges.facts import AKRI, DRA, ClaimFacts, PodFacts, QueueWorld, Settings
from agent.charges.owner import (
    FIRST_BIND,
    LABEL,
    NO_QUEUE,
    ORPHAN_ATTRIBUTED,
    ORPHAN_DEDUCTED,
    UNUSED,
    decide,
    totals,
)
from agent.charges.preempt import preemptibility
from agent.charges.resolve import resolve
from agent.domain.jsonpatch import JsonPatchTestFailed, apply_json_patch

ORDER = Settings().resolvers


def pod(name="p", labels=None, annotations=None, priority=None, created="", ns="ns"):
    return PodFacts(ns, name, f"uid-{name}", labels or {}, annotations or {}, priority, created)


def claim(users=(), labels=None, amount=1, kind=DRA, accounted=True):
    return ClaimFacts(
        kind, "ns", "gpu", "gpu.example.com", amount, labels or {}, tuple(users), accounted
    )


# --- resolvers -------------------------------------------------------------------------------
def test_kai_label_names_the_queue_and_works_without_kai_objects():
    found = resolve(pod(labels={"kai.scheduler/queue": "team-a"}), QueueWorld(), ORDER)
    assert (found.queue, found.source) == ("team-a", "kai")


def test_kai_podgroup_queue_is_read_when_the_pod_has_no_label():
    world = QueueWorld(kai_queues=frozenset({"q1"}), kai_podgroups={("ns", "pg"): "q1"})
    found = resolve(pod(annotations={"pod-group-name": "pg"}), world, ORDER)
    assert found.queue == "q1"


def test_kueue_local_queue_leads_to_its_cluster_queue():
    world = QueueWorld(
        kueue_local_queues={("ns", "lq"): "cq"}, kueue_cluster_queues=frozenset({"cq"})
    )
    found = resolve(pod(labels={"kueue.x-k8s.io/queue-name": "lq"}), world, ORDER)
    assert (found.queue, found.source) == ("cq", "kueue")


def test_kueue_without_objects_uses_the_label_alone():
    found = resolve(pod(labels={"kueue.x-k8s.io/queue-name": "lq"}), QueueWorld(), ORDER)
    assert found.queue == "lq"


def test_volcano_podgroup_then_annotation():
    world = QueueWorld(volcano_podgroups={("ns", "pg"): "vq"})
    assert (
        resolve(pod(annotations={"scheduling.k8s.io/group-name": "pg"}), world, ORDER).queue == "vq"
    )
    bare = pod(annotations={"scheduling.volcano.sh/queue-name": "v2"})
    assert resolve(bare, QueueWorld(), ORDER).queue == "v2"


def test_an_unknown_queue_gives_no_queue_and_says_why():
    world = QueueWorld(kai_queues=frozenset({"team-a"}))
    found = resolve(pod(labels={"kai.scheduler/queue": "team-x"}), world, ORDER)
    assert found.queue is None
    assert "unknown kai queue 'team-x'" in found.problems[0]


def test_a_label_typo_falls_to_the_default_queue_and_is_reported():
    found = resolve(pod(labels={"kai.scheduler/queu": "team-a"}), QueueWorld(), ORDER)
    assert found.queue == "default"
    assert "typo" in found.problems[0] and "kai.scheduler/queu" in found.problems[0]


def test_the_configured_order_decides_between_systems():
    both = pod(labels={"kai.scheduler/queue": "k", "kueue.x-k8s.io/queue-name": "q"})
    assert resolve(both, QueueWorld(), ("kueue", "kai")).queue == "q"
    assert resolve(both, QueueWorld(), ("kai", "kueue")).queue == "k"


def test_without_a_default_an_unlabelled_pod_has_no_queue():
    found = resolve(pod(), QueueWorld(default_queue=""), ORDER)
    assert found.queue is None and found.source == "none"


# --- preemptibility --------------------------------------------------------------------------
def test_priority_100_and_above_is_non_preemptible_below_is_preemptible():
    assert preemptibility(pod(priority=100)).preemptible is False
    assert preemptibility(pod(priority=99)).preemptible is True
    assert preemptibility(pod()).preemptible is True


def test_an_explicit_kai_label_wins_over_priority():
    explicit = pod(labels={"kai.scheduler/preemptibility": "preemptible"}, priority=500)
    assert preemptibility(explicit).preemptible is True
    explicit = pod(labels={"kai.scheduler/preemptibility": "non-preemptible"}, priority=1)
    assert preemptibility(explicit).preemptible is False


def test_volcano_preemptable_false_is_non_preemptible():
    assert preemptibility(pod(annotations={"volcano.sh/preemptable": "false"})).preemptible is False


# --- owners and charges ----------------------------------------------------------------------
A = pod("a1", {"kai.scheduler/queue": "a"}, created="2026-01-01T00:00:02Z")
B = pod("b1", {"kai.scheduler/queue": "b"}, created="2026-01-01T00:00:01Z")


def test_the_owner_label_decides_and_the_owner_pays_for_the_whole_claim():
    charge = decide(claim([B], {"akri-site.io/queue": "a"}, amount=2), QueueWorld(), Settings())
    assert (charge.owner, charge.source, charge.charged) == ("a", LABEL, 2)
    assert charge.foreign_queues == {"b"} and charge.write_label is None


def test_a_first_bind_decides_and_asks_for_the_label():
    charge = decide(claim([A]), QueueWorld(), Settings())
    assert (charge.owner, charge.source, charge.write_label) == ("a", FIRST_BIND, "a")


def test_a_pod_with_no_queue_label_never_gets_the_default_queue_written_as_owner():
    # Issue 28: a broker pod with no queue label made the worker label the Instance "default",
    # a queue no queue system defined, for ever (the label is immutable).
    broker = pod("broker")
    for world in (QueueWorld(), QueueWorld(kai_queues=frozenset({"a"}))):
        charge = decide(claim([broker]), world, Settings())
        assert (charge.owner, charge.source, charge.write_label) == ("default", FIRST_BIND, None)
        assert "which no queue system defines: label not written" in charge.why


def test_the_default_queue_is_written_once_a_queue_system_defines_it():
    world = QueueWorld(volcano_queues=frozenset({"default", "v"}))
    charge = decide(claim([pod("broker")]), world, Settings())
    assert charge.write_label == "default"


def test_a_queue_the_installed_systems_do_not_define_is_never_written():
    # KAI is not installed (its label is taken at its word), Volcano is and has no queue "a".
    world = QueueWorld(volcano_queues=frozenset({"v"}))
    charge = decide(claim([A]), world, Settings())
    assert (charge.owner, charge.write_label) == ("a", None)
    defined = decide(claim([A]), QueueWorld(volcano_queues=frozenset({"a"})), Settings())
    assert defined.write_label == "a"


def test_an_orphan_is_deducted_or_attributed_to_the_earliest_pod():
    deducted = decide(claim([A, B]), QueueWorld(), Settings(orphans="deduct"))
    assert (deducted.owner, deducted.source, deducted.charged, deducted.uncharged) == (
        None,
        ORPHAN_DEDUCTED,
        0,
        1,
    )
    attributed = decide(claim([A, B]), QueueWorld(), Settings(orphans="attribute"))
    assert (attributed.owner, attributed.source, attributed.charged) == ("b", ORPHAN_ATTRIBUTED, 1)
    assert attributed.write_label is None


def test_a_claim_with_no_pods_is_shown_and_charged_to_nobody():
    assert decide(claim([], amount=0), QueueWorld(), Settings()).source == UNUSED
    held = decide(claim([], amount=1), QueueWorld(), Settings())
    assert (held.source, held.charged, held.uncharged) == (NO_QUEUE, 0, 1)


def test_a_resource_not_accounted_is_shown_and_never_charged():
    charge = decide(claim([A], accounted=False), QueueWorld(), Settings())
    assert charge.owner == "a" and charge.charged == 0 and charge.uncharged == 0
    assert "not accounted" in charge.why


def test_an_owner_label_naming_an_unknown_queue_is_not_charged():
    world = QueueWorld(kai_queues=frozenset({"a"}))
    charge = decide(claim([A], {"akri-site.io/queue": "nope"}), world, Settings())
    assert charge.charged == 0 and charge.uncharged == 1
    assert "unknown owner queue 'nope'" in charge.problems


def test_an_owner_label_typo_is_reported_and_the_claim_is_treated_as_unlabelled():
    charge = decide(claim([A], {"akri-site.io/queu": "b"}), QueueWorld(), Settings())
    assert charge.source == FIRST_BIND and charge.owner == "a"
    assert any("typo" in p for p in charge.problems)


def test_totals_split_owned_used_of_others_and_lent():
    charges = [
        decide(claim([A, B], {"akri-site.io/queue": "a"}, kind=AKRI), QueueWorld(), Settings()),
        decide(claim([B, A], amount=3), QueueWorld(), Settings()),  # orphan, deducted
    ]
    out = totals(charges)
    assert out["a"].charged == {"gpu.example.com": 1} and out["a"].used_by_others == 1
    assert out["b"].uses_of_others == 1 and out["b"].orphans == 1 and out["b"].total == 0


# --- admission -------------------------------------------------------------------------------
OWNED_BY_A = Joined(DRA, "ns", "gpu", "a")


def test_a_preemptible_foreign_pod_may_join():
    assert admit_pod(B, [OWNED_BY_A], QueueWorld(), Settings()).allowed


def test_a_non_preemptible_foreign_pod_is_refused_with_the_claim_owner_and_rule():
    strict = pod("b2", {"kai.scheduler/queue": "b"}, priority=125)
    verdict = admit_pod(strict, [OWNED_BY_A], QueueWorld(), Settings())
    assert not verdict.allowed
    for part in ("resourceclaim ns/gpu", "owned by queue a", "resource locking", "priority 125"):
        assert part in verdict.message


def test_any_foreign_pod_is_refused_by_an_opted_out_owner():
    verdict = admit_pod(B, [OWNED_BY_A], QueueWorld(opted_out=frozenset({"a"})), Settings())
    assert not verdict.allowed and "opt-out" in verdict.message


def test_the_owners_own_pods_and_unaccounted_claims_are_allowed():
    strict_a = pod("a2", {"kai.scheduler/queue": "a"}, priority=1000)
    assert admit_pod(strict_a, [OWNED_BY_A], QueueWorld(), Settings()).allowed
    free = Joined(DRA, "ns", "gpu", "a", accounted=False)
    assert admit_pod(
        pod("b3", {"kai.scheduler/queue": "b"}, priority=1000), [free], QueueWorld(), Settings()
    ).allowed


def test_the_owner_label_is_immutable_and_only_writers_add_it_later():
    kw = dict(writers=frozenset({"system:serviceaccount:akri:akri-site"}), label_key="k", shown="x")
    assert admit_owner_label(
        operation="CREATE", old_labels=None, new_labels={"k": "a"}, username="u", **kw
    ).allowed
    changed = admit_owner_label(
        operation="UPDATE",
        old_labels={"k": "a"},
        new_labels={"k": "b"},
        username="system:serviceaccount:akri:akri-site",
        **kw,
    )
    assert not changed.allowed and "immutable" in changed.message
    removed = admit_owner_label(
        operation="UPDATE", old_labels={"k": "a"}, new_labels={}, username="u", **kw
    )
    assert not removed.allowed and "removed" in removed.message
    added = admit_owner_label(
        operation="UPDATE", old_labels={}, new_labels={"k": "a"}, username="u", **kw
    )
    assert not added.allowed and "may not" in added.message
    assert admit_owner_label(
        operation="UPDATE",
        old_labels=None,
        new_labels={"k": "a"},
        username="system:serviceaccount:akri:akri-site",
        **kw,
    ).allowed


def test_the_owner_label_patch_is_create_only_with_and_without_a_labels_map():
    bare = {"metadata": {"name": "x", "resourceVersion": "5"}}
    done = apply_json_patch(bare, owner_label_patch(None, "5", "akri-site.io/queue", "a"))
    assert done["metadata"]["labels"] == {"akri-site.io/queue": "a"}
    raced = {
        "metadata": {"name": "x", "resourceVersion": "6", "labels": {"akri-site.io/queue": "b"}}
    }
    try:
        apply_json_patch(raced, owner_label_patch(None, "5", "akri-site.io/queue", "a"))
        raise AssertionError("the write over a newer version went through")
    except JsonPatchTestFailed:
        pass
    seen = {"app": "x"}
    labelled = {"metadata": {"labels": {"app": "x", "akri-site.io/queue": "b"}}}
    try:
        apply_json_patch(labelled, owner_label_patch(seen, "5", "akri-site.io/queue", "a"))
        raise AssertionError("the owner label was overwritten")
    except JsonPatchTestFailed:
        pass
    fine = apply_json_patch(
        {"metadata": {"labels": dict(seen)}},
        owner_label_patch(seen, "5", "akri-site.io/queue", "a"),
    )
    assert fine["metadata"]["labels"] == {"app": "x", "akri-site.io/queue": "a"}


def test_the_label_waits_while_a_user_of_the_claim_is_not_known():
    charge = decide(
        ClaimFacts(DRA, "ns", "gpu", "g", 1, {}, (A,), True, ("slot gpu-0 held by node n1",)),
        QueueWorld(),
        Settings(),
    )
    assert charge.owner == "a" and charge.write_label is None
    assert "slot gpu-0 held by node n1: pod not known yet" in " ".join(charge.problems)


# --- KAI's top owner (as its PodGroup records it) -----------------------------------------------
def kai_world(labels: dict[str, str], metadata: str = "kind: Job\nname: train-7\nuid: job-7\n"):
    from agent.charges.topowner import from_podgroup

    owner = from_podgroup(labels, {"kai.scheduler/top-owner-metadata": metadata})
    return QueueWorld(
        kai_top_owners_by_podgroup={("ml", "pg-7"): owner},
        kai_top_owners_by_uid={owner.uid: owner},
    )


def test_the_top_owner_named_by_the_pods_podgroup_gives_the_queue_before_the_pods_label():
    world = kai_world({"kai.scheduler/queue": "team-b"})
    pod = PodFacts(
        "ml", "p", labels={"kai.scheduler/queue": "team-a"}, annotations={"pod-group-name": "pg-7"}
    )
    found = resolve(pod, world, ("kai", "default"))
    assert found.queue == "team-b"
    assert found.why == "top owner Job train-7 label kai.scheduler/queue=team-b"


def test_a_pod_owned_by_the_top_owner_finds_it_by_uid_before_it_is_annotated():
    world = kai_world({"kai.scheduler/preemptibility": "non-preemptible"})
    pod = PodFacts("ml", "p", priority=10, owner_uids=("rs-1", "job-7"))
    verdict = preemptibility(pod, world)
    assert verdict.preemptible is False
    assert verdict.why == "top owner Job train-7 kai.scheduler/preemptibility=non-preemptible"


def test_a_pod_whose_owner_kai_has_not_grouped_yet_uses_its_own_labels():
    world = kai_world({"kai.scheduler/queue": "team-b"})
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-a"}, owner_uids=("other",))
    assert resolve(pod, world, ("kai",)).queue == "team-a"


def test_the_legacy_top_owner_annotation_and_odd_yaml_are_read_leniently():
    from agent.charges.topowner import from_podgroup, parse_metadata

    assert parse_metadata("group: ''\nkind: \"PyTorchJob\"\n  nested: x\nname: t\nuid: u") == {
        "group": "",
        "kind": "PyTorchJob",
        "name": "t",
        "uid": "u",
    }
    owner = from_podgroup({"a": "b"}, {"run.ai/top-owner-metadata": "kind: Job\nuid: u\n"})
    assert (owner.shown, owner.uid, dict(owner.labels)) == ("Job ?", "u", {"a": "b"})
    assert from_podgroup({"a": "b"}, {}) is None


# --- Configuration-level requests ---------------------------------------------------------------
def cl(count: int, unique: bool = True, accounted: bool = True):
    """Configuration cam: Instances cam-a (team-a's), cam-b, cam-c, two slots each."""
    from agent.charges.admission import cl_request

    instances = {"cam-a": 2, "cam-b": 2, "cam-c": 2}
    return cl_request("cam", count, unique, instances, {"cam-a": "team-a"}, accounted)


def test_a_cl_request_fits_on_open_instances_and_is_allowed_with_a_warning():
    from agent.charges.admission import admit_pod as admit

    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"}, priority=500)
    verdict = admit(pod, [], QueueWorld(), Settings(), [cl(2)])
    assert verdict.allowed is True
    assert "must not be given cam-a (queue team-a) (rule: resource locking)" in verdict.warnings[0]


def test_a_cl_request_that_needs_a_closed_instance_is_refused_naming_it():
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"}, priority=500)
    verdict = admit_pod(pod, [], QueueWorld(), Settings(), [cl(3)])
    assert verdict.allowed is False and verdict.rule == "resource locking"
    assert verdict.owner == "team-a" and verdict.claim == "Configuration cam (akri.sh/cam: 3)"
    assert "only 2 distinct Instances of it are open to it: cam-a (queue team-a)" in (
        verdict.message
    )


def test_packing_counts_the_slots_left_open():
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"})
    world = QueueWorld(opted_out=frozenset({"team-a"}))
    assert admit_pod(pod, [], world, Settings(), [cl(4, unique=False)]).allowed is True
    refused = admit_pod(pod, [], world, Settings(), [cl(5, unique=False)])
    assert refused.allowed is False and refused.rule == "opt-out"
    assert "only 4 slots" in refused.message


def test_a_cl_request_of_the_owners_queue_or_an_unaccounted_one_is_not_checked():
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-a"}, priority=500)
    assert admit_pod(pod, [], QueueWorld(), Settings(), [cl(3)]) == ALLOW
    other = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"}, priority=500)
    assert admit_pod(other, [], QueueWorld(), Settings(), [cl(3, accounted=False)]) == ALLOW


def test_a_large_configurations_closed_instances_are_counted_and_a_few_named():
    from agent.charges.admission import cl_request

    instances = {f"cam-{i:04d}": 1 for i in range(2000)}
    owners = {f"cam-{i:04d}": "team-a" for i in range(1500)}
    request = cl_request("cam", 501, True, instances, owners, True)
    assert len(request.owned) == 1 and request.owned[0].instances == 1500
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"}, priority=500)
    refused = admit_pod(pod, [], QueueWorld(), Settings(), [request])
    assert refused.allowed is False
    assert "only 500 distinct Instances" in refused.message
    assert "cam-0004 (queue team-a) and 1495 more are owned" in refused.message


def test_a_cl_refusal_names_both_rules_when_both_close_instances():
    from agent.charges.admission import cl_request

    instances = {"cam-a": 1, "cam-b": 1, "cam-c": 1}
    request = cl_request("cam", 2, True, instances, {"cam-a": "team-a", "cam-b": "team-c"}, True)
    pod = PodFacts("ml", "p", labels={"kai.scheduler/queue": "team-b"}, priority=500)
    world = QueueWorld(opted_out=frozenset({"team-c"}))
    refused = admit_pod(pod, [], world, Settings(), [request])
    assert refused.allowed is False and refused.rule == "opt-out, resource locking"
    assert (
        "cam-a (queue team-a), cam-b (queue team-c) are owned by queues that do not share or "
        "by other queues and the pod is non-preemptible, priority 500 >= 100" in refused.message
    )
