"""``polytrain port-code``: Paddle and MXNet Gluon source rewritten into PyTorch source
by a mapping table kept as data (the TOML files here), each entry proven by a test that
runs both APIs; what cannot be converted stays in place under a marker comment."""

from polytrain.porting.code.convert import Result, convert_source
from polytrain.porting.code.files import EXIT_UNCONVERTED, port_code
from polytrain.porting.code.report import FileReport, Report

__all__ = ["EXIT_UNCONVERTED", "FileReport", "Report", "Result", "convert_source", "port_code"]
