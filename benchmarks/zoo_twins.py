"""Which zoo models of Paddle (``paddle.vision.models``) and Gluon
(``mxnet.gluon.model_zoo.vision``) have a torchvision twin, which were tried and do not,
and which have no torchvision counterpart at all: the tables of ``benchmarks.zoo_maps``,
and how to build each side. A twin computes the same function with the same tensors
(under other names); ``benchmarks.zoo_maps`` checks that with ``polytrain port``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Twin:
    """The zoo model ``key`` (``paddle:vgg11_bn``), built by the zoo's ``builder`` with
    ``kwargs``, and torchvision's ``torchvision(weights=None, **tv_kwargs)``, run at
    ``size`` x ``size`` (Gluon's fixed-size final pools need the zoo's own input size)."""

    key: str
    torchvision: str
    builder: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    tv_kwargs: dict[str, Any] = field(default_factory=dict)
    size: int = 224
    why: str = ""  # for a pair that is no twin: what differs

    @property
    def zoo(self) -> str:
        return self.key.partition(":")[0]

    @property
    def name(self) -> str:
        return self.key.partition(":")[2]

    @property
    def build_name(self) -> str:
        return self.builder or self.name

    def source_call(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        where = "paddle.vision.models." if self.zoo == "paddle" else "gluon.model_zoo.vision."
        if self.zoo == "gluon":
            return f"{where}get_model({self.build_name!r}{', ' + args if args else ''})"
        return f"{where}{self.build_name}({args})"

    def torchvision_call(self) -> str:
        args = ", ".join(["weights=None", *(f"{k}={v!r}" for k, v in self.tv_kwargs.items())])
        return f"torchvision.models.{self.torchvision}({args})"


_INCEPTION = {"aux_logits": False, "init_weights": False}


def _paddle_twins() -> list[Twin]:
    same = [
        "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
        "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2", "vgg11", "vgg13", "vgg16",
        "vgg19", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
        "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
        "densenet121", "densenet161", "densenet169", "densenet201",
    ]  # fmt: skip
    twins = [Twin(f"paddle:{name}", name) for name in same]
    for depth in (11, 13, 16, 19):  # Paddle builds VGG with BatchNorm by an argument
        twins.append(Twin(f"paddle:vgg{depth}_bn", f"vgg{depth}_bn", f"vgg{depth}",
                          {"batch_norm": True}))  # fmt: skip
    return twins


def _gluon_twins() -> list[Twin]:
    twins = [Twin("gluon:resnet18_v1", "resnet18"), Twin("gluon:resnet34_v1", "resnet34")]
    for depth in (11, 13, 16, 19):
        twins += [Twin(f"gluon:vgg{depth}", f"vgg{depth}"),
                  Twin(f"gluon:vgg{depth}_bn", f"vgg{depth}_bn")]  # fmt: skip
    twins.append(Twin("gluon:alexnet", "alexnet"))
    twins += [Twin(f"gluon:densenet{n}", f"densenet{n}") for n in (121, 161, 169, 201)]
    twins += [Twin("gluon:squeezenet1.0", "squeezenet1_0"),
              Twin("gluon:squeezenet1.1", "squeezenet1_1")]  # fmt: skip
    twins.append(Twin("gluon:inceptionv3", "inception_v3", tv_kwargs=_INCEPTION, size=299))
    return twins


TWINS: list[Twin] = [*_paddle_twins(), *_gluon_twins()]

_PADDLE_DROPOUT = "its Dropout(mode='downscale_in_infer') scales by 1 - p in eval"
_GLUON_BOTTLENECK = (
    "Gluon's BottleneckV1 strides its first 1x1 convolution and gives its convolutions "
    "biases; torchvision's (v1.5) strides the 3x3 and has none"
)
_GLUON_MOBILENET_V2 = (
    "Gluon's blocks expand by a 1x1 convolution also where t is 1 and its classifier is a "
    "1x1 convolution without bias"
)
TRIED: list[Twin] = [  # pairs of the same name that polytrain port shows to compute otherwise
    Twin("paddle:squeezenet1_0", "squeezenet1_0",
         why=f"its max pools round down (torchvision's up) and {_PADDLE_DROPOUT}"),
    Twin("paddle:squeezenet1_1", "squeezenet1_1",
         why=f"its first convolution pads by 1 and {_PADDLE_DROPOUT}"),
    Twin("paddle:inception_v3", "inception_v3", tv_kwargs=_INCEPTION, size=299,
         why=f"its BatchNorm epsilon is 1e-5 (torchvision's 1e-3) and {_PADDLE_DROPOUT}"),
    Twin("paddle:googlenet", "googlenet", tv_kwargs=_INCEPTION,
         why="it has no BatchNorm (torchvision's GoogLeNet has one after each convolution)"),
    Twin("paddle:alexnet", "alexnet", why=_PADDLE_DROPOUT),
    Twin("paddle:shufflenet_v2_x2_0", "shufflenet_v2_x2_0",
         why="its second stage has 224 channels, torchvision's 244"),
    *(Twin(f"gluon:resnet{d}_v1", f"resnet{d}", why=_GLUON_BOTTLENECK) for d in (50, 101, 152)),
    *(Twin(f"gluon:mobilenetv2_{w}", "mobilenet_v2", tv_kwargs={"width_mult": float(w)},
           why=_GLUON_MOBILENET_V2) for w in ("1.0", "0.75", "0.5", "0.25")),
]  # fmt: skip

_RESNEXT = "torchvision's ResNeXts are resnext50_32x4d, resnext101_32x8d and resnext101_64x4d"
NO_COUNTERPART: dict[str, str] = {
    "paddle:lenet": "torchvision has no LeNet.",
    "paddle:mobilenet_v1": "torchvision has no MobileNet v1.",
    "paddle:resnext50_64x4d": f"{_RESNEXT}.",
    "paddle:resnext101_32x4d": f"{_RESNEXT}.",
    "paddle:resnext152_32x4d": f"{_RESNEXT}.",
    "paddle:resnext152_64x4d": f"{_RESNEXT}.",
    "paddle:densenet264": "torchvision's DenseNets are 121, 161, 169 and 201.",
    "paddle:shufflenet_v2_x0_25": "torchvision's ShuffleNet v2 widths are 0.5, 1.0, 1.5, 2.0.",
    "paddle:shufflenet_v2_x0_33": "torchvision's ShuffleNet v2 widths are 0.5, 1.0, 1.5, 2.0.",
    "paddle:shufflenet_v2_swish": "torchvision's ShuffleNet v2 uses ReLU, not swish.",
    **{
        f"gluon:resnet{d}_v2": "it is a pre-activation ResNet (v2): torchvision has none."
        for d in (18, 34, 50, 101, 152)
    },
    **{f"gluon:mobilenet{w}": "torchvision has no MobileNet v1." for w in ("1.0", "0.75", "0.5",
                                                                            "0.25")},
}  # fmt: skip


# -- building each side ---------------------------------------------------------------------------


def build_source(twin: Twin, rng: np.random.Generator, classes: int | None = None) -> Any:
    """The zoo model with random weights and BatchNorm statistics (``classes``: the zoo's
    default, else that many), in eval mode, its deferred shapes (Gluon) set."""
    if twin.zoo == "paddle":
        import paddle.vision.models as vision

        kwargs = {**twin.kwargs, **({"num_classes": classes} if classes else {})}
        model = getattr(vision, twin.build_name)(**kwargs)
        randomize_paddle_bn(model, rng)
        model.eval()
        return model
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    kwargs = {**twin.kwargs, **({"classes": classes} if classes else {})}
    model = vision.get_model(twin.build_name, **kwargs)
    model.initialize(mx.init.Xavier())
    model(mx.nd.zeros((1, 3, twin.size, twin.size)))
    randomize_gluon_bn(model, rng)
    return model


def randomize_paddle_bn(model: Any, rng: np.random.Generator) -> None:
    """Paddle's BatchNorm starts at mean 0, variance 1, scale 1, shift 0: give each a value."""
    import paddle

    state = model.state_dict()
    for name, value in state.items():
        if len(value.shape) != 1 or not name.endswith(("_mean", "_variance", "weight", "bias")):
            continue
        low_high = (0.5, 1.5) if name.endswith(("_variance", "weight")) else (-0.1, 0.1)
        state[name] = paddle.to_tensor(rng.uniform(*low_high, value.shape).astype("float32"))
    model.set_state_dict(state)


def randomize_gluon_bn(model: Any, rng: np.random.Generator) -> None:
    """The same for Gluon (``gamma``/``beta``, ``running_mean``/``running_var``)."""
    import mxnet as mx

    for name, param in model._collect_params_with_prefix().items():
        if not name.endswith(("running_mean", "beta", "running_var", "gamma")):
            continue
        low_high = (0.5, 1.5) if name.endswith(("running_var", "gamma")) else (-0.1, 0.1)
        param.set_data(mx.nd.array(rng.uniform(*low_high, param.shape).astype("float32")))


def source_logits(twin: Twin, model: Any, batch: np.ndarray) -> np.ndarray:
    """The zoo model's output on ``batch`` (eval mode)."""
    if twin.zoo == "paddle":
        import paddle

        with paddle.no_grad():
            return np.asarray(model(paddle.to_tensor(batch)).numpy())
    import mxnet as mx

    return np.asarray(model(mx.nd.array(batch)).asnumpy())


def save_source(twin: Twin, model: Any, path: str) -> None:
    """The zoo model's weights as its framework saves them (``paddle.save`` of its state
    dict, Gluon's ``save_parameters``)."""
    if twin.zoo == "paddle":
        import paddle

        paddle.save(model.state_dict(), path)
    else:
        model.save_parameters(path)
