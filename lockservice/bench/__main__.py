import sys

from lockservice.bench.cli import main

sys.exit(main())
