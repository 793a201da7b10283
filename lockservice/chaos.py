"""
C{python -m lockservice.chaos}: see L{lockservice.verify.chaos}.
"""

if __name__ == "__main__":
    from lockservice.verify.chaos import main

    raise SystemExit(main())
