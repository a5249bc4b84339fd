"""udev: rule parsing and matching on recorded devices, and the discovery session."""

from __future__ import annotations

import os
import time

import pytest

from agent.discovery.base import DeviceSpec, DiscoveryError
from agent.discovery.udev import (
    DEFAULT_RECORDING,
    PyudevSource,
    RecordedSource,
    UdevHandler,
    UdevMatch,
    discover,
    load_records,
    parse_details,
    parse_rule,
)

from .test_discovery_base import Recorder

USB = "/devices/pci0000:00/0000:00:14.0/usb1"
VIDEO0 = f"{USB}/1-2/1-2:1.0/video4linux/video0"
CARD0 = "/devices/pci0000:00/0000:00:1f.3/sound/card0"


@pytest.fixture(scope="module")
def devices():
    return RecordedSource.from_file().devices()


def found(devices, *rules: str, extra: str = "") -> list[str]:
    """Sysnames of the devices the rules discover."""
    yaml_rules = "".join(f"- '{r}'\n" for r in rules)
    details = parse_details(f"udevRules:\n{yaml_rules}{extra}")
    return [d.id.rsplit("/", 1)[-1] for d in discover(details, devices)]


def test_it_parses_a_rule_into_matches():
    rule = 'KERNEL=="video[0-9]*", SUBSYSTEM=="video4linux",ATTRS{idVendor}!="05a9|046d"'
    assert parse_rule(rule) == (
        UdevMatch("KERNEL", None, False, ("video[0-9]*",)),
        UdevMatch("SUBSYSTEM", None, False, ("video4linux",)),
        UdevMatch("ATTRS", "idVendor", True, ("05a9", "046d")),
    )


def test_it_unescapes_quotes_in_values():
    assert parse_rule(r'ATTR{name}=="say \"hi\""')[0].patterns == ('say "hi"',)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("", "empty"),
        ('NAME=="cam"', "unsupported key NAME"),
        ('ACTION=="add"', "unsupported key ACTION"),
        ('KERNEL="video0"', "may only match"),
        ('ENV{X}+="1"', "may only match"),
        ('ATTR=="1"', r"write ATTR\{name\}"),
        ('KERNEL{x}=="1"', "write KERNEL,"),
        ('ATTRS{}=="1"', r"write ATTRS\{name\}"),
        ("KERNEL==video0", "cannot parse"),
        ('KERNEL=="video0" SUBSYSTEM=="x"', "expected ','"),
        ('KERNEL=="video0",', "trailing ','"),
    ],
)
def test_it_refuses_rules_it_cannot_honour(rule, message):
    with pytest.raises(DiscoveryError, match=message):
        parse_rule(rule)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ('KERNEL=="video[0-9]*"', ["video0", "video1", "video2", "video3"]),
        ('KERNEL=="video[!01]"', ["video2", "video3"]),
        ('KERNEL=="video[^01]"', ["video2", "video3"]),
        ('SUBSYSTEM=="tty", KERNEL=="ttyS?|ttyUSB0"', ["ttyUSB0", "ttyS0"]),
        # A USB serial port is two devices named ttyUSB0 (usb-serial and tty), as on a real host.
        ('KERNEL=="ttyUSB0"', ["ttyUSB0", "ttyUSB0"]),
        ('SUBSYSTEM=="video4linux", ATTRS{idVendor}=="046d"', ["video0", "video1"]),
        ('SUBSYSTEM=="video4linux", ATTRS{idVendor}!="046d"', ["video2", "video3"]),
        ('SUBSYSTEM=="video4linux", ENV{ID_V4L_CAPABILITIES}=="*:capture:*"', ["video0", "video2"]),
        ('SUBSYSTEM=="video4linux", ATTR{index}=="0", DRIVERS=="uvcvideo"', ["video0", "video2"]),
        ('SUBSYSTEM=="tty", KERNEL!="ttyS*"', ["ttyUSB0"]),
        ('SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{idProduct}=="6001"', ["ttyUSB0"]),
        ('SUBSYSTEM=="tty", SUBSYSTEMS=="usb"', ["ttyUSB0"]),
        ('SUBSYSTEM=="tty", KERNELS=="serial8250"', ["ttyS0"]),
        ('SUBSYSTEM=="sound", TAG=="uaccess"', ["controlC0", "pcmC0D0c", "pcmC0D0p"]),
        ('SUBSYSTEM=="sound", TAG!="uaccess"', ["card0"]),
        (
            'SUBSYSTEM=="sound", KERNEL=="pcm*", ATTR{pcm_class}=="generic"',
            ["pcmC0D0c", "pcmC0D0p"],
        ),
        ('SUBSYSTEM=="usb", DRIVER=="ftdi_sio"', ["1-4:1.0"]),
        ('SUBSYSTEM=="usb-serial", DRIVER!="ftdi_sio"', []),
        ('SUBSYSTEM=="mem", DRIVER!="*"', ["null"]),
        ('DEVPATH=="/devices/virtual/*"', ["mem", "null"]),
        ('SUBSYSTEM=="video4linux", ATTR{no_such_attribute}=="*"', []),
        ('KERNEL=="video0", ATTR{no_such_attribute}!="x"', ["video0"]),
        (
            'SUBSYSTEM=="sound", ATTRS{vendor}=="0x8086", ATTRS{no_such}!="1"',
            ["card0", "controlC0", "pcmC0D0c", "pcmC0D0p"],
        ),  # fmt: skip
    ],
)
def test_rules_match_recorded_devices(devices, rule, expected):
    assert sorted(found(devices, rule)) == sorted(expected)


def test_parent_keys_may_match_on_different_ancestors(devices):
    # Akri's reading: each parent key walks the chain on its own.
    assert found(devices, 'KERNEL=="video0", DRIVERS=="uvcvideo", ATTRS{product}=="HD*"') == [
        "video0"
    ]


def test_a_discovered_device_carries_akris_properties_and_a_device_spec(devices):
    details = parse_details("udevRules: ['KERNEL==\"video0\"']\npermissions: rw")
    (camera,) = discover(details, devices)
    assert camera.id == VIDEO0
    assert camera.properties == {"UDEV_DEVPATH": VIDEO0, "UDEV_DEVNODE": "/dev/video0"}
    assert camera.device_specs == (DeviceSpec("/dev/video0", "/dev/video0", "rw"),)
    assert camera.mounts == ()


def test_permissions_default_to_rwm_and_a_device_without_node_has_no_spec(devices):
    details = parse_details('udevRules: [\'SUBSYSTEM=="sound", KERNEL=="card0|controlC0"\']')
    card, control = discover(details, devices)
    assert card.properties == {"UDEV_DEVPATH": CARD0} and card.device_specs == ()
    assert control.device_specs[0].permissions == "rwm"


def test_devices_matching_several_rules_appear_once(devices):
    assert found(devices, 'KERNEL=="video0"', 'SUBSYSTEM=="video4linux", ATTR{index}=="0"') == [
        "video0",
        "video2",
    ]


def test_group_recursive_folds_children_into_the_topmost_match(devices):
    details = parse_details("udevRules: ['SUBSYSTEM==\"sound\"']\ngroupRecursive: true")
    (card,) = discover(details, devices)
    assert card.id == CARD0
    assert card.properties == {
        "UDEV_DEVPATH": CARD0,
        "UDEV_DEVNODE_0": "/dev/snd/controlC0",
        "UDEV_DEVNODE_1": "/dev/snd/pcmC0D0c",
        "UDEV_DEVNODE_2": "/dev/snd/pcmC0D0p",
    }
    assert [s.host_path for s in card.device_specs] == [
        "/dev/snd/controlC0",
        "/dev/snd/pcmC0D0c",
        "/dev/snd/pcmC0D0p",
    ]


def test_group_recursive_groups_by_path_component_not_string_prefix():
    # Akri compares devpaths as strings, which folds port 1-10 into its sibling 1-1.
    hub = "/devices/pci0000:00/0000:00:14.0/usb1"
    records = [
        {"devpath": hub, "subsystem": "usb"},
        {"devpath": f"{hub}/1-1", "parent": hub, "subsystem": "usb", "devnode": "/dev/bus/usb/001/002"},
        {"devpath": f"{hub}/1-10", "parent": hub, "subsystem": "usb", "devnode": "/dev/bus/usb/001/011"},
        {"devpath": f"{hub}/1-10/1-10:1.0", "parent": f"{hub}/1-10", "subsystem": "usb"},
    ]  # fmt: skip
    details = parse_details("udevRules: ['KERNEL==\"1-1*\"']\ngroupRecursive: true")
    grouped = discover(details, RecordedSource(records).devices())
    assert [(d.id, len(d.device_specs)) for d in grouped] == [(f"{hub}/1-1", 1), (f"{hub}/1-10", 1)]


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ("", "empty"),
        ("udevRules: 'KERNEL==\"x\"'", "list of strings"),
        ("rules: []", "'udevRules'"),
        ("udevRules: []\ngroupRecursive: 'yes'", "true or false"),
        ("udevRules: []\npermissions: rwx", "combine r, w and m"),
        ("udevRules: []\npermissions: ''", "combine r, w and m"),
        ("udevRules: ['TEST==\"x\"']", "unsupported key TEST"),
    ],
)
def test_it_refuses_invalid_details(details, message):
    with pytest.raises(DiscoveryError, match=message):
        parse_details(details)


def test_no_rules_means_no_devices(devices):
    assert discover(parse_details("udevRules: []"), devices) == []


class CountingSource(RecordedSource):
    def __init__(self, records):
        super().__init__(records)
        self.scans = 0

    def devices(self):
        self.scans += 1
        return super().devices()


@pytest.fixture
def source():
    return CountingSource(load_records(DEFAULT_RECORDING))


def recorded_without(fragment: str) -> list[dict]:
    """The recording with every device whose devpath contains ``fragment`` unplugged."""
    return [r for r in load_records(DEFAULT_RECORDING) if fragment not in r["devpath"]]


def test_a_session_reports_on_change_only_and_rescans_on_hotplug(source):
    handler = UdevHandler(source, rescan_interval=0.02)
    assert (handler.name, handler.shared) == ("udev", False)
    rec = Recorder()
    session = handler.start(
        'udevRules: ["KERNEL==\\"video[0-9]*\\""]', {}, rec.on_devices, rec.on_error
    )
    try:
        rec.wait_for(lambda r: r.ids is not None and len(r.ids) == 4)
        rec.wait_for(lambda r: source.scans >= 6)
        assert len(rec.lists) == 1
        # Unplug the second camera: its video nodes vanish from the records.
        source.set_records(recorded_without("/1-3"))
        rec.wait_for(lambda r: r.ids is not None and len(r.ids) == 2)
        assert rec.ids == [VIDEO0, VIDEO0[:-1] + "1"]
    finally:
        session.stop()


def test_a_hotplug_event_wakes_a_long_rescan_interval(source):
    handler = UdevHandler(source, rescan_interval=60)
    rec = Recorder()
    session = handler.start(
        'udevRules: [\'SUBSYSTEM=="tty", KERNEL=="ttyUSB*"\']', {}, rec.on_devices, rec.on_error
    )
    try:
        rec.wait_for(lambda r: r.ids is not None and len(r.ids) == 1)
        started = time.monotonic()
        source.set_records(recorded_without("ttyUSB"))
        rec.wait_for(lambda r: r.ids == [], timeout=20)
        assert time.monotonic() - started < 20  # generous: a missed removal, not speed
    finally:
        t = time.monotonic()
        session.stop()
        assert time.monotonic() - t < 10  # generous: a stop that hangs, not speed


def test_invalid_details_fail_at_start(source):
    with pytest.raises(DiscoveryError):
        UdevHandler(source).start("udevRules: ['NAME==\"x\"']", {}, print, print)


@pytest.mark.skipif(not os.path.exists("/sys/devices/virtual/mem/null"), reason="needs Linux sysfs")
def test_the_pyudev_source_reads_this_host():
    source = PyudevSource(monitor=False)
    details = parse_details('udevRules: [\'SUBSYSTEM=="mem", KERNEL=="null"\']')
    (null,) = discover(details, source.devices())
    assert null.id == "/devices/virtual/mem/null"
    assert null.properties["UDEV_DEVPATH"] == "/devices/virtual/mem/null"
