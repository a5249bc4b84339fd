"""The node agent: discovery wiring, the Instance lifecycle and the kubelet device plugins.

``agent.NodeAgent`` is the engine; ``manage.py runagent`` runs one per node. Its parts:
``view`` (what the agent knows of the namespace), ``instances`` (conditional Instance writes),
``discovery`` (sessions per Configuration), ``plugin`` / ``il`` / ``cl`` / ``responses`` (the
device-plugin servers and their Allocate answers) and ``loop`` (the asyncio thread they run
on). ``reconcile`` and ``podresources`` are the node-local slot reconciler the agent starts.
"""
