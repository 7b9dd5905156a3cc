"""``python -m fencepost``: the same command line as ``fencepost``."""

import sys

from fencepost.cli import main

sys.exit(main())
