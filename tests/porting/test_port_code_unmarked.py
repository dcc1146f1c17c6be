"""Conversions that depend on what only the run time knows are right in every case or
marked (issue 36, item 3), on Paddle: a cross-entropy label of shape [N, 1] or [N], of any
dtype, with the classes on any axis, computes Paddle's numbers (float64, 1e-10), where the
one-to-one PyTorch call raised or computed others; a Paddle loader called to iterate it;
``a.parameters() + b.parameters()`` (lists in Paddle); functions of ``math`` and ``numpy``
are not a framework's methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.porting.code import convert_source

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")

RNG = np.random.default_rng(3)
LOGITS_2D = RNG.standard_normal((6, 5))
LOGITS_3D = RNG.standard_normal((2, 3, 5))
LOGITS_4D = RNG.standard_normal((2, 5, 3, 3))
LABELS = RNG.integers(0, 5, size=(6, 1))
LABELS_3D = RNG.integers(0, 5, size=(2, 3, 1))
LABELS_4D = RNG.integers(0, 5, size=(2, 1, 3, 3))

# (paddle code, logits, label): `out` is the loss; the label as the code takes it
CASES = [
    ("out = F.cross_entropy(x, y)", LOGITS_2D, LABELS),
    ("out = F.cross_entropy(x, y, reduction='none')", LOGITS_2D, LABELS),
    ("out = F.cross_entropy(x, y.squeeze(-1), reduction='none')", LOGITS_2D, LABELS),
    ("out = F.cross_entropy(x, paddle.cast(y, 'int32'), reduction='sum')", LOGITS_2D, LABELS),
    ("out = F.cross_entropy(x, paddle.cast(y, 'float64'))", LOGITS_2D, LABELS),
    ("out = F.cross_entropy(x, y, reduction='none')", LOGITS_3D, LABELS_3D),
    ("out = F.cross_entropy(x, y, axis=1, reduction='none')", LOGITS_4D, LABELS_4D),
    ("out = paddle.nn.CrossEntropyLoss()(x, y)", LOGITS_2D, LABELS),
    ("out = paddle.nn.CrossEntropyLoss(reduction='none')(x, y)", LOGITS_3D, LABELS_3D),
    ("loss_fn = paddle.nn.CrossEntropyLoss(weight=w)\nout = loss_fn(x, y)", LOGITS_2D, LABELS),
]  # fmt: skip
HEADER = "import paddle\nimport paddle.nn.functional as F\n"


def _paddle(code: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ns: dict[str, Any] = {"x": paddle.to_tensor(x), "y": paddle.to_tensor(y),
                          "w": paddle.to_tensor(np.linspace(0.5, 1.5, 5))}  # fmt: skip
    exec(HEADER + code, ns)
    return np.asarray(ns["out"].numpy())


def _torch(code: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    ns: dict[str, Any] = {"x": torch.tensor(x), "y": torch.tensor(y),
                          "w": torch.tensor(np.linspace(0.5, 1.5, 5))}  # fmt: skip
    exec(code, ns)
    return ns["out"].detach().numpy()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "code, x, y", CASES, ids=lambda v: str(v)[:48] if isinstance(v, str) else ""
)
def test_cross_entropy_labels_as_paddle_takes_them(code: str, x: np.ndarray, y: np.ndarray) -> None:
    result = convert_source(HEADER + code)
    assert not [u for u in result.report.uses if not u.converted], result.code
    want, got = _paddle(code, x, y), _torch(result.code, x, y)
    assert want.shape == got.shape, (want.shape, got.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_the_one_to_one_call_refuses_paddles_n_by_1_labels() -> None:
    with pytest.raises(RuntimeError):
        torch.nn.functional.cross_entropy(torch.tensor(LOGITS_2D), torch.tensor(LABELS))


LOADER = """import paddle
from paddle.io import DataLoader, TensorDataset

x = paddle.arange(8, dtype='float64').reshape([4, 2])
loader = DataLoader(TensorDataset([x]), batch_size=2)
batches = [b for i, b in enumerate(loader())]
net, other = paddle.nn.Linear(2, 2), paddle.nn.Linear(2, 1)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters() + other.parameters())
"""


def test_a_loader_called_to_iterate_it_and_parameter_lists_added() -> None:
    code = convert_source(LOADER).code
    assert "enumerate(loader)" in code
    assert "list(net.parameters()) + list(other.parameters())" in code
    ns: dict[str, Any] = {}
    exec(code.replace("TensorDataset([x])", "TensorDataset(x)"), ns)  # Paddle's takes a list
    assert len(ns["batches"]) == 2
    assert sum(p.numel() for p in ns["opt"].param_groups[0]["params"]) == 9


def test_functions_of_math_and_numpy_are_not_framework_methods() -> None:
    source = (
        "import math\nimport numpy as np\nfrom mxnet import nd\n\n"
        "def f(x, n):\n    return math.exp(n) + np.sqrt(n) + x.exp() + nd.exp(x)\n"
    )
    result = convert_source(source)
    assert "math.exp(n) + np.sqrt(n) + x.exp() + torch.exp(x)" in result.code
    assert all(u.converted for u in result.report.uses)
    assert sorted(u.api for u in result.report.uses) == [".exp", "mxnet.nd.exp"]


LAZY = """from mxnet import init
from mxnet.gluon import nn

net = nn.Sequential()
net.add(nn.Dense(4, flatten=False, weight_initializer=init.Constant(0.5)),
        nn.Dense(2, flatten=False))
net.initialize(init.Constant(2.0))
"""


def test_gluon_initializers_of_lazy_layers_apply_at_the_first_call_not_over_loaded_weights() -> (
    None
):
    code = convert_source(LAZY).code
    ns: dict[str, Any] = {}
    exec(code, ns)
    net = ns["net"]
    net(torch.zeros(1, 3))
    assert torch.all(net[0].weight == 0.5) and torch.all(net[1].weight == 2.0)
    assert torch.all(net[0].bias == 0) and torch.all(net[1].bias == 0)
    fresh: dict[str, Any] = {}
    exec(code, fresh)
    loaded = {k: torch.full((4, 3) if k == "0.weight" else v.shape, 7.0)
              for k, v in net.state_dict().items()}  # fmt: skip
    fresh["net"].load_state_dict(loaded)
    fresh["net"](torch.zeros(1, 3))
    assert all(torch.all(v == 7.0) for v in fresh["net"].state_dict().values())


def test_d2l_devices_are_the_books_on_this_machine() -> None:
    code = convert_source("import d2lzh as d2l\none, every = d2l.try_gpu(), d2l.try_all_gpus()\n")
    ns: dict[str, Any] = {}
    exec(code.code, ns)
    gpus = torch.cuda.device_count()
    assert ns["one"] == (torch.device("cuda", 0) if gpus else torch.device("cpu"))
    assert ns["every"] == ([torch.device("cuda", i) for i in range(gpus)] or [torch.device("cpu")])


# ---- the corpus's second pass (issue 36): run-time choices, types, grouping --------------

SOFT = RNG.standard_normal((4, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("given", ["soft_label=True", "soft_label=soft", "soft_label=hard"])
def test_cross_entropy_soft_label_decided_when_it_runs(given: str, reduction: str) -> None:
    """``soft_label=`` a name (PaddleClas's CELoss): the helper takes the label as a
    distribution or as class indices by its value when it runs, as Paddle does."""
    label = "F.softmax(y, axis=-1)" if given != "soft_label=hard" else "paddle.cast(z, 'int64')"
    code = (
        "soft, hard = True, False\n"
        f"out = F.cross_entropy(x, label={label}, {given}, reduction='{reduction}')\n"
    )
    result = convert_source(HEADER + code)
    assert all(u.converted for u in result.report.uses), result.code
    arrays = {"x": LOGITS_2D[:4], "y": SOFT, "z": LABELS[:4]}
    ns_p = {k: paddle.to_tensor(v) for k, v in arrays.items()}
    ns_t = {k: torch.tensor(v) for k, v in arrays.items()}
    exec(HEADER + code, ns_p)
    exec(result.code, ns_t)
    want, got = ns_p["out"].numpy(), ns_t["out"].detach().numpy()
    assert want.shape == got.shape, (want.shape, got.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_downscale_dropout_keeps_values_in_training_and_scales_them_in_eval() -> None:
    code = "layer = paddle.nn.Dropout(p=0.25, mode='downscale_in_infer')\n"
    result = convert_source(HEADER + code)
    assert all(u.converted for u in result.report.uses), result.code
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    src: dict[str, Any] = {}
    exec(HEADER + code, src)
    x = RNG.standard_normal((20, 10)) + 3.0
    src["layer"].eval()
    ns["layer"].eval()
    want = src["layer"](paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(ns["layer"](torch.tensor(x)).numpy(), want, rtol=0, atol=1e-12)
    ns["layer"].train()
    trained = ns["layer"](torch.tensor(x)).numpy()
    kept = trained != 0
    assert np.array_equal(trained[kept], x[kept]) and 0 < kept.sum() < x.size


TYPES = """import paddle
from paddle import nn

layers = [nn.Linear(2, 3), nn.Conv2D(1, 1, 3), nn.ReLU()]
out = [type(m) == nn.Linear for m in layers]
out += [isinstance(m, (nn.Linear, nn.Conv2D)) for m in layers]
out += [issubclass(type(layers[1]), nn.Conv2D), nn.Linear is not type(layers[0])]
"""


def test_a_layer_class_compared_or_checked_is_its_pytorch_class() -> None:
    result = convert_source(TYPES)
    assert all(u.converted for u in result.report.uses), result.code
    ns_p: dict[str, Any] = {}
    ns_t: dict[str, Any] = {}
    exec(TYPES, ns_p)
    exec(result.code, ns_t)
    assert ns_t["out"] == ns_p["out"] == [True, False, False, True, True, False, True, False]


def test_an_expression_entry_called_or_operated_on_keeps_its_grouping() -> None:
    """``Normal(std=0.5)(w)``: the initializer, a ``lambda`` in PyTorch, is called on the
    tensor (unparenthesised, the line was a lambda that did nothing)."""
    code = "import paddle\nw = paddle.zeros([3, 4])\npaddle.nn.initializer.Constant(value=0.5)(w)\n"
    result = convert_source(code)
    assert all(u.converted for u in result.report.uses), result.code
    ns: dict[str, Any] = {}
    exec(result.code, ns)
    assert torch.all(ns["w"] == 0.5), result.code


WEIGHT = """import paddle

linear = paddle.nn.Linear(3, 3)
out = x @ linear.weight  # an operator: not a product call (transposed_reads.py)
"""


def test_the_weight_of_a_linear_made_here_is_marked_where_it_is_used() -> None:
    """Paddle's Linear holds its weight [in, out], PyTorch's [out, in]: ``x @ w`` of a
    square one runs on both and computes other numbers (no error to tell)."""
    result = convert_source(WEIGHT)
    left = [u for u in result.report.uses if not u.converted]
    assert [u.api for u in left] == ["paddle.nn.Linear.weight"], result.code
    assert "[out, in] in PyTorch" in left[0].why
    ns_p: dict[str, Any] = {"x": paddle.to_tensor(LOGITS_2D[:2, :3].astype(np.float32))}
    exec(WEIGHT, ns_p)
    ns_t: dict[str, Any] = {"x": torch.tensor(LOGITS_2D[:2, :3].astype(np.float32))}
    exec(result.code, ns_t)
    with torch.no_grad():  # the same layer: PyTorch's weight is Paddle's transposed
        ns_t["linear"].weight.copy_(torch.tensor(ns_p["linear"].weight.numpy().T))
        naive = ns_t["x"] @ ns_t["linear"].weight
    assert not np.allclose(naive.numpy(), ns_p["out"].numpy())


def test_the_high_level_model_saves_into_a_folder_it_makes(tmp_path: Path) -> None:
    """``model.save('ckpt/final')`` (and ``fit(save_dir=...)``): Paddle makes the folder."""
    code = convert_source(
        "import paddle\nmodel = paddle.Model(paddle.nn.Linear(2, 1))\nmodel.save(path)\n"
    ).code
    ns: dict[str, Any] = {"path": str(tmp_path / "ckpt" / "final")}
    exec(code, ns)
    assert (tmp_path / "ckpt" / "final.pt").exists()
