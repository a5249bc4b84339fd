"""Per-device sharing policies behind one small interface (seed 004, Volcano's ``Devices``).

``policy`` holds the interface and the plain data a policy is built from; each policy is a
module of its own (``akri_instance``, ``akri_configuration``, ``gpushare``, ``gpu_number``),
found through the ``akri_site.sharing_policies`` entry-point group (``registry``). Nothing here
imports Django, gRPC, HTTP or the extender: the rules are unit- and property-tested alone.
"""
