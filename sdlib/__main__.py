import sys

from sdlib.cli import main

sys.exit(main())
