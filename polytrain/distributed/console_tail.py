"""Rank 0's output on the console while ``polytrain launch --log-dir`` runs.

Every worker writes ``LOG_DIR/workerlog.<rank>``; Paddle's launcher also shows rank 0's
output on its console, torchrun and polytrain's MXNet launcher do not. :class:`FollowLog`
gives them the same: a thread copies what ``workerlog.0`` gains to the console, as
``tail -F`` would (a file that appears later, or is replaced by a rename, is followed from
its start; a file left by an earlier run in the same folder, from its end).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

CHUNK = 1 << 16


class FollowLog:
    """Copies what ``path`` gains to ``out`` until the context ends (then the rest)."""

    def __init__(self, path: Path, out: BinaryIO | None = None, interval: float = 0.2) -> None:
        self.path, self.interval = path, interval
        self.out = out if out is not None else sys.stdout.buffer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="follow-workerlog", daemon=True)
        self._inode, self._offset = self._stat()  # an earlier run's file: from its end

    def _stat(self) -> tuple[int | None, int]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None, 0
        return st.st_ino, st.st_size

    def __enter__(self) -> FollowLog:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._copy_new()
        self._copy_new()  # what the last worker wrote before the launch ended

    def _copy_new(self) -> None:
        inode, size = self._stat()
        if inode is None:
            return
        if inode != self._inode:  # a new file (created, or renamed into place)
            self._inode, self._offset = inode, 0
        if size < self._offset:  # truncated
            self._offset = 0
        if size == self._offset:
            return
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                while chunk := fh.read(CHUNK):
                    self._offset += len(chunk)
                    self.out.write(chunk)
            self.out.flush()
        except (OSError, ValueError):  # the console went away, or the file did
            return
