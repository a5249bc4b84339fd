"""Queue charges for shared devices and DRA claims (seed 003), as plain Python.

A device shared by pods of several queues (an Akri Instance whose slots are held by pods of
different queues, a DRA ResourceClaim reserved for pods of different queues) is paid for by
exactly one queue, its owner. These modules decide, from facts handed to them, which queue a pod
belongs to (``resolve``), whether a pod may be evicted (``preempt``), who owns and pays for
each claim (``owner``), and what the admission webhook answers (``admission``). They import
neither Django, gRPC nor HTTP, so that they can be property-tested alone.
"""
