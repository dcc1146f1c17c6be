"""How a run ran, carried by ``train --resume``: ``run-options.toml`` in the run folder.

A checkpoint holds the recipe; the options of the command that trained it (the backend,
how often it saved, its trackers, its health limits) are written beside it when a run
starts, as a recipe file of those keys. ``train --resume RUN`` takes them where its own
command line does not give them, so a resumed run logs and saves as the run did.
Plugins are code and ``--tensorboard`` writes outside the run: the file names them,
``--resume`` does not take them (one line says to give them again). The file is read as
data, each value checked as its option checks it (the rules of recipe files,
:func:`polytrain.cli.config_file.option_value`); a bad one is one line.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from polytrain.cli.config_file import line_of, option_value
from polytrain.errors import ConfigError
from polytrain.io.run_dir import RUN_OPTIONS_FILE
from polytrain.utils.fileio import atomic_write_text
from polytrain.utils.user_files import TEXT_LIMIT, read_text

#: the options a resumed run takes from its run (the recipe comes from the checkpoint)
CARRIED = (
    "backend", "fast", "timeout", "checkpoint_every", "metrics_every", "keep_checkpoints",
    "log", "keep_best", "max_skipped", "max_loss_growth",
)  # fmt: skip
#: recorded and named on resume, never taken from the file (the folder is data)
NOTED = {
    "plugin": "plugins are code",
    "tensorboard": "a folder to write outside the run is not taken from its files",
}


def record_run_options(args: argparse.Namespace, folder: Path, backend: str) -> None:
    """Write the options of this command (those it was given, and those a resume
    carried) and the ``backend`` it resolved to ``folder``'s ``run-options.toml``,
    atomically."""
    import tomli_w

    values = {
        dest: getattr(args, dest)
        for dest in (*CARRIED, *NOTED)
        if dest in args.explicit and getattr(args, dest) not in (None, [])
    } | {"backend": backend}
    text = "# the options polytrain train ran with; train --resume takes them\n"
    atomic_write_text(folder / RUN_OPTIONS_FILE, text + tomli_w.dumps(values))


def carry_run_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Set ``args`` from the resumed run's ``run-options.toml`` where the command line
    did not; the carried options then count as given (the resumed run records them)."""
    from polytrain.io.checkpoint import run_folder

    folder = run_folder(args.resume)
    path = folder / RUN_OPTIONS_FILE if folder is not None else None
    if path is None or not path.is_file():
        return
    text = read_text(path, "--resume", TEXT_LIMIT)
    try:
        values: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}; delete it to resume.") from None
    actions = {a.dest: a for a in parser._actions if a.dest in (*CARRIED, *NOTED)}
    for key, value in values.items():
        where = f"{path}, {line_of(text, key)}: {key}"
        if key not in actions:
            raise ConfigError(f"{where}: not an option a resume carries; delete the line.")
        converted = option_value(actions[key], key, value, where)
        if key in NOTED:
            if key not in args.explicit:
                _name_noted(key, converted)
        elif key not in args.explicit:
            setattr(args, key, converted)
            args.explicit.add(key)


def _name_noted(key: str, value: Any) -> None:
    """One line: the run had this option, which a resume does not take from the file."""
    option = "--" + key.replace("_", "-")
    values = value if isinstance(value, list) else [value]
    given = " ".join(f"{option} {v}" for v in values)
    print(f"polytrain train: the resumed run had {given}; {NOTED[key]}: give it again "
          "to use it.", file=sys.stderr)  # fmt: skip
