"""
The pure core: the lock table and token issuer, the wire grammar, the role
vocabulary and election rules.

Nothing here imports C{twisted.internet} or another layer of the package;
every call that depends on time is told the time.  (Checked by the
import-linter contracts in C{setup.cfg}.)
"""
