"""
Helpers shared by the tests: nodes driven through StringTransport and
task.Clock, fakes, and small builders.  Test modules import from here,
never from each other.
"""
