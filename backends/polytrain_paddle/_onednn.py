"""oneDNN kernels for chosen ops of a Paddle static (PIR) program, Paddle's own for the rest.

``FLAGS_use_onednn`` turns every op oneDNN has into its oneDNN form; in a training step
that runs oneDNN's reference kernels (``ref:any``, 10-50x slower) wherever two tensors
meet in different memory formats: the average pool's backward and the convolution
bias's reduction cost more than the convolutions gained (docs/performance.md, "Paddle's
static graph"). So :func:`place` runs Paddle's ``onednn_placement_pass`` on a copy of
the program and moves only the chosen ops' oneDNN forms (``KEEP``) back into it; the
executor converts layouts where a oneDNN op meets a Paddle one.

The pass finds the ``onednn_op`` dialect only once Paddle has registered it, which its
executor does on its first oneDNN run: :func:`register_dialect` runs a one-op program
with the flag on, once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle.base import core

PASS = "onednn_placement_pass"
PASS_LEVEL = 3  # the pass's opt level: a PassManager below it skips the pass


def _avg_pool(op: Any) -> bool:
    return bool(op.attrs().get("pooling_type") == "avg")


#: op (without dialect) -> whether this instance runs oneDNN's kernel (measured: the
#: convolutions and the average pool; everything else is faster in Paddle's own here)
KEEP: dict[str, Callable[[Any], bool]] = {
    "conv2d": lambda op: True,
    "conv2d_grad": lambda op: True,
    "depthwise_conv2d": lambda op: True,
    "depthwise_conv2d_grad": lambda op: True,
    "pool2d": _avg_pool,
    "pool2d_grad": _avg_pool,
}


def available() -> bool:
    """Whether this Paddle has oneDNN kernels (the CPU wheels do)."""
    return bool(core.is_compiled_with_onednn())


@functools.cache
def register_dialect() -> None:
    """Make Paddle register its oneDNN dialect: one tiny oneDNN program run."""
    flag = "FLAGS_use_onednn"
    before = paddle.get_flags([flag])[flag]
    paddle.set_flags({flag: True})
    try:
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [1, 1], "float32")
            y = F.relu(x)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(main, feed={"x": np.ones((1, 1), "float32")}, fetch_list=[y],
                scope=paddle.static.Scope())  # fmt: skip
    finally:
        paddle.set_flags({flag: before})


def place(program: Any, held: Sequence[Any], keep: dict[str, Callable[[Any], bool]] = KEEP
          ) -> list[Any]:  # fmt: skip
    """Give the ops ``keep`` names their oneDNN kernels, in place; returns ``held`` (values
    of ``program`` the caller keeps) as they are after the move (a moved op's results are
    new values)."""
    register_dialect()
    ops = list(program.global_block().ops)
    where = [_locate(ops, v) for v in held]
    copy = program.clone()
    manager = paddle.pir.PassManager(PASS_LEVEL)
    manager.add_pass(PASS, {})
    manager.run(copy)
    placed = list(copy.global_block().ops)
    if len(placed) != len(ops):
        raise RuntimeError(f"{PASS} changed the op count ({len(ops)} -> {len(placed)})")
    mapping = paddle.pir.IrMapping()
    for mine, theirs in zip(ops, placed, strict=True):
        for value, other in zip(mine.results(), theirs.results(), strict=True):
            mapping.add(other, value)
    for mine, theirs in zip(ops, placed, strict=True):
        name = theirs.name()
        dialect, _, kind = name.partition(".")
        if dialect != "onednn_op" or not keep.get(kind, lambda op: False)(theirs):
            continue
        moved = theirs.clone(mapping, paddle.pir.CloneOptions(False, True, False))
        moved.move_before(mine)
        if moved.has_attr("is_test"):  # the pass is an inference pass: it sets is_test
            moved.set_bool_attr("is_test", False)
        mine.replace_all_uses_with(moved.results())
        mine.erase()
    ops = list(program.global_block().ops)
    return [ops[i].result(j) for i, j in where]


def _locate(ops: Sequence[Any], value: Any) -> tuple[int, int]:
    """(op index, result index) of ``value`` in ``ops``."""
    owner = value.get_defining_op()
    for i, op in enumerate(ops):
        if op.id() == owner.id():
            for j, result in enumerate(op.results()):
                if result.is_same(value):
                    return i, j
    raise RuntimeError(f"value of {owner.name()} not found in the program")
