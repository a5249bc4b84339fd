"""The node agent: discovery wiring, the Instance lifecycle and the kubelet device plugins.

``agent.NodeAgent`` is the engine; ``manage.py runagent`` runs one per node. The rest are its
parts: ``view`` (what the agent knows of the namespace), ``instances`` (conditional Instance
writes), ``discovery`` (sessions per Configuration), ``plugin`` / ``il`` / ``cl`` (the
device-plugin servers) and ``loop`` (the asyncio thread they run on).
"""
