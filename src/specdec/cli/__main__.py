"""python -m specdec.cli ARGS: the `specdec` command."""

import sys

from specdec.cli import main

sys.exit(main())
