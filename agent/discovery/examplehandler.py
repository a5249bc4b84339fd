"""A stand-alone external discovery handler process, as Akri's DHs run beside the agent.

    python -m agent.discovery.examplehandler --name pyecho --socket /tmp/a.sock \\
        --register /var/lib/akri/agent-registration.sock --device foo0 --device foo1

It serves ``v0.DiscoveryHandler/Discover`` on its own Unix socket, streaming the fixed devices
given (``--device ID``, each with property ``EXAMPLE_DESCRIPTION=ID``), registers with the
agent, prints ``ready`` once registered, and runs until SIGTERM or SIGINT. Tests use it to run
several real handler processes under one name; it imports no Django, so it starts fast.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from agent.discovery.base import DiscoveredDevice
from agent.discovery.external import ExampleDiscoveryHandlerServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="discovery handler name to register")
    parser.add_argument("--socket", required=True, help="Unix socket to serve Discover on")
    parser.add_argument("--register", required=True, help="the agent's registration socket")
    parser.add_argument("--device", action="append", default=[], help="a device id (repeat)")
    parser.add_argument("--unshared", action="store_true", help="register with shared=false")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    devices = [DiscoveredDevice(d, {"EXAMPLE_DESCRIPTION": d}) for d in args.device]
    server = ExampleDiscoveryHandlerServer(
        args.socket, devices, name=args.name, shared=not args.unshared
    ).start()
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        server.register(args.register)
        print("ready", flush=True)
        stopping.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
