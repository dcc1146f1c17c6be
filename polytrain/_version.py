"""The version of polytrain (a module of its own: any layer may import it)."""

__version__ = "0.1.0"
