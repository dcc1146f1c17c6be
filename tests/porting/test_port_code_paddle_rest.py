"""``polytrain port-code`` rules for the Paddle calls left in the registry corpus (issue
36, the rest of the corpus): each program runs on Paddle and, converted, on PyTorch, and
the two agree; what the tool cannot know stays marked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")


def _converted(source: str) -> str:
    result = convert_source(source, "rest.py")
    left = [u for u in result.report.uses if not u.converted]
    assert not left, f"left unconverted: {left}\n{result.code}"
    return result.code


def _left(source: str) -> list[str]:
    return [u.api for u in convert_source(source, "rest.py").report.uses if not u.converted]


def _run(source: str, x: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program's names after a run on Paddle and, converted, on PyTorch."""
    code = _converted(source)
    src: dict[str, Any] = {"x": paddle.to_tensor(x)}
    exec(source, src)
    tgt: dict[str, Any] = {"x": torch.tensor(x)}
    exec(code, tgt)
    return src, tgt


SPLIT = """
import paddle

parts = paddle.split(x, x.shape[-1], axis=-1)
halves = paddle.split(x, num_or_sections=len([0, 1]), axis=0)
"""


def test_split_by_a_shape_entry_is_that_many_equal_parts() -> None:
    """``paddle.split(x, x.shape[-1])``: an int (a shape entry, ``len(...)``), so that many
    equal parts (torch.chunk), where a name stays marked."""
    src, tgt = _run(SPLIT, np.arange(24.0).reshape(4, 6))
    for name in ("parts", "halves"):
        assert len(src[name]) == len(tgt[name])
        for a, b in zip(src[name], tgt[name], strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert _left("import paddle\nout = paddle.split(x, n)\n") == ["paddle.split"]


DTYPE_NAME = """
import paddle

single = paddle.get_default_dtype() == "float32"
other = "float64" != paddle.get_default_dtype()
half = paddle.get_default_dtype() in ("float16", "bfloat16")
"""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_default_dtype_compared_with_names_is_its_name(dtype: str) -> None:
    """``paddle.get_default_dtype() == 'float32'``: compared with names, the default dtype
    is its name (as Paddle's) where a torch.dtype would never equal the string; printed it
    stays marked."""
    paddle.set_default_dtype(dtype)
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        src, tgt = _run(DTYPE_NAME, np.zeros(1))
    finally:
        paddle.set_default_dtype("float32")
        torch.set_default_dtype(torch.float32)
    assert [src[n] for n in ("single", "other", "half")] == [
        tgt[n] for n in ("single", "other", "half")
    ]
    assert src["single"] is (dtype == "float32")
    marked = "import paddle\nprint(paddle.get_default_dtype())\n"
    marked += "ok = paddle.get_default_dtype() == d\n"
    assert _left(marked) == ["paddle.get_default_dtype"] * 2
