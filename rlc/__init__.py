"""rlc: the Rack LifeCycle Controller, the fleet tier's power-budget allocator (issue 16).

Its pure core (`rlc.core`): the site → hall → row → rack topology with its limits,
the allocation of row and hall power among racks, and budget leases with the rule of when
released headroom may be granted again, and `rlc.core.cycle` (one cycle over the KV state).
The daemon: `rlc.app` (leadership on the daemon frame, the fleet KV bucket; docs/RLC.md).
"""
