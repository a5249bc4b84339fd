"""The PodResources client: what it keeps of a List answer, and how it fails."""

from __future__ import annotations

import pytest

from agent.node.podresources import (
    DeviceUse,
    PodResourcesClient,
    PodResourcesUnavailable,
    uses_of,
)
from agent.protos import podresources_pb2 as pr


def test_only_akri_devices_are_kept_and_numa_split_entries_are_merged():
    answer = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="web",
                namespace="apps",
                containers=[
                    pr.ContainerResources(
                        name="main",
                        devices=[
                            pr.ContainerDevices(
                                resource_name="akri.sh/cams-8120fe", device_ids=["cams-8120fe-0"]
                            ),
                            pr.ContainerDevices(
                                resource_name="akri.sh/cams-8120fe", device_ids=["cams-8120fe-0"]
                            ),
                            pr.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=["GPU-1"]
                            ),
                            pr.ContainerDevices(
                                resource_name="akri.sh/cams", device_ids=["cams-0", "cams-1"]
                            ),
                        ],
                    )
                ],
            )
        ]
    )

    uses = uses_of(answer)

    assert sorted(uses, key=lambda u: u.device_id) == [
        DeviceUse("akri.sh/cams", "cams-0", "apps", "web", "main"),
        DeviceUse("akri.sh/cams", "cams-1", "apps", "web", "main"),
        DeviceUse("akri.sh/cams-8120fe", "cams-8120fe-0", "apps", "web", "main"),
    ]


def test_a_kubelet_that_is_not_there_is_a_temporary_error(tmp_path):
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), timeout=2)
    try:
        with pytest.raises(PodResourcesUnavailable, match="UNAVAILABLE"):
            client.list()
    finally:
        client.close()
