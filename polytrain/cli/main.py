"""The ``polytrain`` command line: backends, data, train, recipe, compare, convert, port,
port-code, launch, env, doctor.

The entry point: parse (:mod:`polytrain.cli.parser`), apply a recipe file, run the
sub-command (one small function in its command's module), and turn every error the user
can fix into one clear line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence

from polytrain.cli.config_file import apply_config
from polytrain.cli.parser import build_parser
from polytrain.cli.recipe_args import explicit_options
from polytrain.errors import PolytrainError
from polytrain.utils.user_code import DEBUG_VARIABLE, debug_enabled


class Stopped(BaseException):
    """SIGTERM as an exception, so that cleanups run (a half-written temporary file is
    removed, a child run is told to stop) before the command exits 128 + SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


SIGTERM_RAISES = ("compare", "convert", "doctor", "port", "port-code", "recipe", "train")
# launch has its own stop throughout


@contextlib.contextmanager
def _sigterm_raises(command: str) -> Iterator[None]:
    """SIGTERM raises :class:`Stopped` from the start of the command. ``train``'s Trainer
    swaps in its own stop (save, then exit) while it trains and puts this one back after:
    this one covers the start-up (framework import, model build, the user's factory) and
    the end, so a SIGTERM at any moment ends with polytrain's line and 143."""
    if command not in SIGTERM_RAISES:
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drop_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.explicit = explicit_options(argv, args.subparser)
    with _debug(getattr(args, "debug", False)):
        return _run(args)


@contextlib.contextmanager
def _debug(wanted: bool) -> Iterator[None]:
    """``--debug`` as ``POLYTRAIN_DEBUG=1`` for this command (child runs inherit it)."""
    previous = os.environ.get(DEBUG_VARIABLE)
    if wanted:
        os.environ[DEBUG_VARIABLE] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DEBUG_VARIABLE, None)
        else:
            os.environ[DEBUG_VARIABLE] = previous


def _run(args: argparse.Namespace) -> int:
    """The command, with every error the user can fix as one line."""
    try:
        if getattr(args, "config", None):
            args.explicit |= apply_config(args, args.subparser, args.config)
        with _sigterm_raises(args.command):
            code = int(args.func(args))
            sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
            return code
    except BrokenPipeError:  # `polytrain ... --json | head`: the reader left; not an error
        _drop_stdout()
        return 128 + signal.SIGPIPE
    except Stopped as stop:
        name = signal.Signals(stop.signum).name
        print(f"polytrain {args.command}: interrupted by {name}", file=sys.stderr)
        return 128 + stop.signum
    except PolytrainError as exc:
        if debug_enabled():
            traceback.print_exception(exc)
        print(f"polytrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # one a user can cause (a path, a full disk) is one line too
        if exc.filename is None and exc.errno is None:
            raise
        where = f"{exc.filename}: " if exc.filename is not None else ""
        print(f"polytrain {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"polytrain {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
