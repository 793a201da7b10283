"""
The project's own verification tools, run as documented commands:
C{python -m lockservice.chaos} (faults and invariant checkers) and
C{python -m lockservice.failover} (failover, handoff and heal timings).
"""
