"""
C{python -m lockservice.failover}: see L{lockservice.verify.failover}.
"""

if __name__ == "__main__":
    from lockservice.verify.failover import main

    raise SystemExit(main())
