"""
The cluster layer: authenticated peer links, liveness, replication,
election glue and graceful handoff.  It drives the server through the small
interface L{lockservice.server.service.LockService} offers for it.
"""
