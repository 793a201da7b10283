"""
Aids for tests of applications that use lockservice, in the spirit of
C{twisted.internet.testing}: real C{twistd} nodes on loopback
(L{lockservice.testing.harness}) and a fault-injecting TCP proxy
(L{lockservice.testing.proxy}).
"""
