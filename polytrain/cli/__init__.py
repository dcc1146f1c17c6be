"""The ``polytrain`` command."""

from polytrain.cli.main import main

__all__ = ["main"]
