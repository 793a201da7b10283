"""
The cluster layer: authenticated peer links, liveness, replication,
election glue and graceful handoff.  It drives the server through the small
interface L{lockservice.server.service.LockService} offers for it (its
mirror: L{lockservice.server.mirror}).  Inside, modules import one way,
from L{lockservice.cluster.node} down to the peer lines
(L{lockservice.cluster.peerwire}) and the pure rules (an import-linter
contract in setup.cfg).
"""
