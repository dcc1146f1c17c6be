"""Run a command with its output in ``LOG_DIR/workerlog.<rank>`` (as Paddle's launcher does).

``python -m polytrain.worker_log LOG_DIR CMD...``: the rank comes from the launcher's
environment (:func:`polytrain.cluster.resolve`); the process then *becomes* the command
(``exec``), so the launcher still supervises the real worker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .cluster import resolve


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m polytrain.worker_log LOG_DIR CMD [ARGS...]")
    log_dir, cmd = Path(argv[0]), argv[1:]
    rank = resolve().rank
    log_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_dir / f"workerlog.{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
