import sys

from lockservice.cli import main

sys.exit(main())
