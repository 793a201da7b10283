"""
lockservice: a distributed lock service with FIFO queues and fencing tokens.
"""

__version__ = "0.2.0"
