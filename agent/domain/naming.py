"""Names and formats shared with Akri v0.13: digests, Instance and resource names, slot keys.

Everything here must produce byte-identical strings to Akri, because Akri agents, controllers
and brokers may read our objects and we may read theirs (reference: akri-compat.md §3, §4.1).
"""

import hashlib
import re
from collections.abc import Mapping

AKRI_PREFIX = "akri.sh"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"

# Kubernetes' own validation patterns (apimachinery/pkg/util/validation).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME_PART_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# Akri's discoveryProperties name rule; also a safe environment variable name.
_PROPERTY_NAME_RE = re.compile(r"[_A-Za-z][_A-Za-z0-9]*")
_DIGEST_RE = re.compile(r"[0-9a-f]{6}")


def instance_digest(device_id: str, shared: bool, node_name: str) -> str:
    """Six lowercase hex chars. Unshared devices mix in the node so each node gets its own."""
    source = device_id if shared else device_id + node_name
    return hashlib.blake2b(source.encode(), digest_size=3).hexdigest()


def instance_name(configuration: str, digest: str) -> str:
    """`<configuration>-<digest>`; v0.13 no longer rewrites `.` or `/`."""
    return f"{configuration}-{digest}"


def cdi_name(configuration: str, digest: str) -> str:
    return f"{AKRI_PREFIX}/{configuration}={digest}"


def digest_from_instance_name(configuration: str, instance: str) -> str | None:
    """The digest part of an Instance name, or None if the name is not `<configuration>-<hex6>`."""
    prefix = configuration + "-"
    if not instance.startswith(prefix):
        return None
    digest = instance[len(prefix) :]
    return digest if _DIGEST_RE.fullmatch(digest) else None


def _parse_index(prefix: str, value: str) -> int | None:
    """The n in `<prefix>-<n>`, only for the canonical spelling of a non-negative integer.

    "x-01" or "x-+1" are refused: accepting them would give one slot two keys.
    """
    head = prefix + "-"
    if not value.startswith(head):
        return None
    suffix = value[len(head) :]
    if not suffix.isascii() or not suffix.isdigit():
        return None
    if len(suffix) > 1 and suffix[0] == "0":
        return None
    try:
        return int(suffix)
    except ValueError:  # more digits than Python converts; no real slot index
        return None


def slot_key(instance: str, index: int) -> str:
    """`<instance>-<i>`: the deviceUsage key and the IL plugin's kubelet device id."""
    if index < 0:
        raise ValueError(f"slot index must be >= 0, got {index}")
    return f"{instance}-{index}"


def slot_index(instance: str, key: str) -> int | None:
    """Index of a slot key of `instance`, or None when the key is not one of its slots."""
    return _parse_index(instance, key)


def il_resource_name(instance: str) -> str:
    """Extended resource of the Instance-level plugin."""
    return f"{AKRI_PREFIX}/{instance}"


def cl_resource_name(configuration: str) -> str:
    """Extended resource of the Configuration-level plugin."""
    return f"{AKRI_PREFIX}/{configuration}"


def cl_device_id(configuration: str, n: int) -> str:
    """`<configuration>-<n>`: a CL plugin's kubelet device id (v0.13 format)."""
    if n < 0:
        raise ValueError(f"CL device number must be >= 0, got {n}")
    return f"{configuration}-{n}"


def parse_cl_device_id(configuration: str, device_id: str) -> int | None:
    """The n of a CL device id of `configuration`, or None (v0.12 bare numbers included)."""
    return _parse_index(configuration, device_id)


def env_suffix(digest: str) -> str:
    return digest.upper()


def broker_envs(properties: Mapping[str, str], digest: str) -> dict[str, str]:
    """Every property twice, as `KEY` and `KEY_<DIGEST>`, as Akri v0.13 does in Allocate.

    Input order is kept. If a property is literally named like another's suffixed form, the
    later entry wins, which is what setting the same env var twice does in a container.
    """
    suffix = env_suffix(digest)
    envs: dict[str, str] = {}
    for key, value in properties.items():
        envs[key] = value
        envs[f"{key}_{suffix}"] = value
    return envs


def plugin_socket_name(plugin_name: str, unix_seconds: int) -> str:
    """Socket file name under DEVICE_PLUGIN_DIR; the timestamp keeps restarts from colliding."""
    return f"{plugin_name}-{unix_seconds}.sock"


def plugin_socket_path(plugin_name: str, unix_seconds: int) -> str:
    return f"{DEVICE_PLUGIN_DIR}/{plugin_socket_name(plugin_name, unix_seconds)}"


def is_dns_label(name: str) -> bool:
    """RFC 1123 label: namespaces, Service names."""
    return len(name) <= 63 and _DNS_LABEL_RE.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    """RFC 1123 subdomain: names of most objects, Instances and Configurations included."""
    return len(name) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(name) is not None


def is_qualified_name(name: str) -> bool:
    """`[prefix/]name` as for labels and extended resources: prefix a DNS subdomain, name <= 63."""
    prefix, slash, short = name.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(short) <= 63 and _QUALIFIED_NAME_PART_RE.fullmatch(short) is not None


def is_resource_name_valid(name: str) -> bool:
    """Whether kubelet will accept this extended resource name (`akri.sh/<x>`, x <= 63 chars).

    Instance names may be up to 253 characters but the resource name part may not: a too-long
    Configuration name yields Instances whose IL plugin kubelet refuses to register.
    """
    return "/" in name and is_qualified_name(name)


def is_property_name(name: str) -> bool:
    """Akri's rule for discoveryProperties names (`^[_A-Za-z][_A-Za-z0-9]*$`)."""
    return _PROPERTY_NAME_RE.fullmatch(name) is not None
