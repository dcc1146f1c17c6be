"""``polytrain`` (or ``python -m MODULE``) as a script file, for launchers that only run
``.py`` files (``paddle.distributed.launch``). Absolute imports: this file runs outside
its package."""

import runpy
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["-m"]:
        module = sys.argv[2]
        sys.argv = [module, *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        from polytrain.cli import main

        sys.exit(main())
