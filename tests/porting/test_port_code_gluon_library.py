"""port-code on Gluon library code (gluon-cv's model zoo, gluon-nlp): what the registry
corpus found beyond ``hybrid_forward`` (tests/porting/test_port_code_hybrid.py)."""

from __future__ import annotations

from polytrain.porting.code import convert_source

DEFAULT = """from mxnet.gluon import nn
from mxnet.gluon.nn import BatchNorm


class Block(nn.HybridBlock):
    def __init__(self, channels, norm_layer=BatchNorm, norm_kwargs=None, **kwargs):
        super().__init__(**kwargs)
        self.bn = norm_layer(**({} if norm_kwargs is None else norm_kwargs))
"""


def test_a_framework_layer_as_a_parameter_default_is_marked() -> None:
    """gluon-cv's ``norm_layer=BatchNorm``: the default was left as it was, unmarked, so
    the converted block made a Gluon layer inside a PyTorch module; it is marked now (a
    Gluon layer class used without a call: its arguments cannot be converted)."""
    result = convert_source(DEFAULT, "block.py")
    assert result.report.unconverted == {"mxnet.gluon.nn.BatchNorm": 1}, result.code
    assert "# polytrain port-code: mxnet.gluon.nn.BatchNorm not converted" in result.code
