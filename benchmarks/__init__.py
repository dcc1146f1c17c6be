"""Benchmarks: polytrain against hand-written native loops (``python -m benchmarks.run``)."""
