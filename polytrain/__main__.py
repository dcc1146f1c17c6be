"""``python -m polytrain`` is the ``polytrain`` command."""

import sys

from polytrain.cli.main import main

sys.exit(main())
