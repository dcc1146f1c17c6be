"""Gluon's classes and their structure converted by ``polytrain port-code``
(polytrain/porting/code/gluon_classes.py): a ``gluon.loss.Loss`` subclass whose
``hybrid_forward`` hands its ``F`` to Gluon's loss helpers (``_reshape_like``,
``_apply_weighting``) runs on PyTorch to the MXNet loss's numbers, with no marker left."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")

LOSS = """from mxnet import nd
from mxnet.gluon.loss import Loss, _apply_weighting, _reshape_like


class MaskedL1Loss(Loss):
    def __init__(self, weight=None, batch_axis=0, **kwargs):
        super(MaskedL1Loss, self).__init__(weight, batch_axis, **kwargs)

    def hybrid_forward(self, F, pred, label, mask, sample_weight=None):
        label = _reshape_like(F, label, pred)
        loss = F.abs(label * mask - pred * mask)
        loss = _apply_weighting(F, loss, self._weight, sample_weight)
        return F.sum(loss, axis=1) / F.sum(mask).clip(1, 1e30)


def box_error(pred, target):
    return nd.abs(_reshape_like(nd, pred, target) - target)
"""


def _run(code: str) -> dict[str, Any]:
    space: dict[str, Any] = {}
    exec(compile(code, "<loss>", "exec"), space)  # the test's own code
    return space


def test_a_loss_subclass_runs_to_mxnets_numbers() -> None:
    """Before: the ``F`` given to ``_reshape_like`` / ``_apply_weighting`` was marked as
    code the tool does not see, and ``nd`` given to them as an unconverted ``mxnet.nd``."""
    result = convert_source(LOSS, "loss.py")
    assert not [u for u in result.report.uses if not u.converted], result.code
    rng = np.random.default_rng(0)
    pred, mask, weight = rng.standard_normal((4, 3)), rng.random((4, 3)), rng.random((4, 1))
    label = rng.standard_normal(12)
    gluon_space, torch_space = _run(LOSS), _run(result.code)
    nd_args = [mx.nd.array(a, dtype="float64") for a in (pred, label, mask, weight)]
    th_args = [torch.tensor(a) for a in (pred, label, mask, weight)]
    for kwargs in ({}, {"weight": 0.5, "prefix": "l1_"}):
        expected = gluon_space["MaskedL1Loss"](**kwargs)(*nd_args).asnumpy()
        got = torch_space["MaskedL1Loss"](**kwargs)(*th_args).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)
    expected = gluon_space["box_error"](nd_args[1], nd_args[0]).asnumpy()
    got = torch_space["box_error"](th_args[1], th_args[0]).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-10)


def test_a_loss_subclass_refuses_shared_parameters() -> None:
    """``params=`` (another block's parameters) has no PyTorch form: refused when made."""
    result = convert_source(LOSS, "loss.py")
    with pytest.raises(NotImplementedError, match="shared parameters"):
        _run(result.code)["MaskedL1Loss"](params={})
