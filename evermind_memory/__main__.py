"""`python -m evermind_memory ...`: the `evermind` command (see cli.py)."""

import sys

from .cli import main

sys.exit(main())
