"""``python -m cairn`` is the ``cairn`` command."""

import sys

from .cli import main

sys.exit(main())
