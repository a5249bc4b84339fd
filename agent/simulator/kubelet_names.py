"""Kubelet rules and error texts used by the kubelet simulator.

Plain functions, kept apart from the gRPC plumbing so they can be tested on their own. The
messages copy the Go kubelet's wording (including Go's `%q` quoting) because plugins and agents
log, match on and show these strings.
"""

import json
import posixpath
import re

import grpc

SUPPORTED_VERSIONS = ("v1beta1",)
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# k8s.io/apimachinery validation: IsDNS1123Subdomain and the name part of IsQualifiedName.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def go_quote(value: str) -> str:
    """Go's `%q` for a string; JSON escaping agrees with it for printable text."""
    return json.dumps(value, ensure_ascii=False)


def go_quote_list(values: tuple[str, ...] | list[str]) -> str:
    """Go's `%q` for a string slice or array: `["a" "b"]`."""
    return "[" + " ".join(go_quote(v) for v in values) + "]"


def unsupported_version_error(version: str) -> str:
    # The kubelet formats its SupportedVersions *array* with %q, hence the brackets.
    return (
        f"requested API version {go_quote(version)} is not supported by kubelet. "
        f"Supported version is {go_quote_list(SUPPORTED_VERSIONS)}"
    )


def invalid_resource_name_error(name: str) -> str:
    return f"the ResourceName {go_quote(name)} is invalid"


def is_qualified_name(value: str) -> bool:
    """IsQualifiedName: optional DNS-1123 subdomain prefix, `/`, name of at most 63 chars."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: the names device plugins may register."""
    # Names without a domain and anything under *kubernetes.io/ are native resources.
    native = "/" not in name or "kubernetes.io/" in name
    if native or name.startswith("requests."):
        return False
    # Quota addresses the resource as `requests.<name>`, so that form must be valid too.
    return is_qualified_name("requests." + name)


def join_endpoint(socket_dir: str, endpoint: str) -> str:
    """Go's filepath.Join: unlike os.path.join, an absolute endpoint stays under the dir."""
    return posixpath.normpath(socket_dir + "/" + endpoint)


def go_status_error(err: grpc.RpcError) -> str:
    """How grpc-go prints a failed call, e.g. `rpc error: code = Unknown desc = boom`."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    if code is grpc.StatusCode.CANCELLED:
        name = "Canceled"  # grpc-go spells it with one L
    else:
        name = "".join(part.capitalize() for part in code.name.split("_"))
    return f"rpc error: code = {name} desc = {details}"
