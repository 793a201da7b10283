"""
One node's server: the service that owns the clock around the pure lock
table, the client line protocol, the monotonic clock, the HTTP status and
metrics.  It knows nothing of the cluster or the client library.
"""
