"""
The pure core: the lock table and token issuer, the wire grammar, the role
vocabulary and election rules.

Nothing here imports C{twisted.internet} or another layer of the package;
every call that depends on time is told the time.  (Checked by the
import-linter contracts in C{setup.cfg}.)

The lock table, by concept: C{table} (L{LockTable}: acquires, releases,
expiries, renewals, withdrawals and hand-overs), C{slots} (where its grants
and the records of its keys are kept), C{views} (its queries), C{holder}
(a view of one grant), C{replica} (installs and drops of replicated
grants), C{lockdelay} (places kept after an expiry), C{shares} (how grants
share a key, and which fit together), C{waiters} (the queue of a key),
C{tokens} (fencing tokens).  The wait-for graph: C{waitfor}
(L{WaitForGraph}: its changes and checks), C{clients} (which client a
connection is), C{cycles} (the deadlocks reported), C{sharedwaits} and
C{shareddeadlocks} (waits for several holders of a read lock or a
semaphore).
"""
