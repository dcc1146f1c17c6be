"""``python -m polytrain`` is the ``polytrain`` command."""

import sys

from .cli import main

sys.exit(main())
