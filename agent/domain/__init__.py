"""Akri's domain rules in plain Python: names, slot formats, claim decisions, sharing policies.

Nothing here imports Django, gRPC, HTTP or Kubernetes clients, so every rule can be unit- and
property-tested alone and reused by the agent, the controller, the simulator and the dashboard.

Modules: `naming` (digests, names, env vars), `slots` (deviceUsage values and per-slot health),
`claims` (claim/release decisions and conditional JSON patches), `cl` (Configuration-level
virtual devices), `jsonpatch` (a small RFC 6902 applier), `errors` (exceptions),
`configspec` (reading a Configuration with Akri's defaults).
"""
