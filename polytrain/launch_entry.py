"""``polytrain`` as a script file, for launchers that only run ``.py`` files
(``paddle.distributed.launch``). Absolute imports: this file runs outside its package."""

import sys

from polytrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
