"""PaddleClas and gluon-cv classification models into their ``timm`` twins (issue 37,
item 2), verified per layer and on the logits.

Neither zoo installs beside Paddle 3.3.1 / MXNet 1.9.1 / torch 2.13 here: gluon-cv refuses
to import beside torch >= 2 (its ``check.py``), PaddleClas pulls its whole training stack
through ``ppcls.utils``. ``timm`` (1.0.31, and back to 0.9) imports ``torchvision`` in
``timm.layers``, and the registry's torchvision is a CUDA build whose C operators fail
beside the CPU torch (``operator torchvision::nms does not exist``). So the sources are
rebuilt from their definitions (PaddleClas ``ppcls/arch/backbone/legendary_models/
resnet.py`` and ``model_zoo/vision_transformer.py``, gluon-cv ``gluoncv/model_zoo/
resnetv1b.py`` and ``mobilenetv3.py``) and the targets from timm's ``timm/models/
resnet.py`` (``resnet18``; ``resnet18d``: deep stem, ``avg_down``),
``vision_transformer.py`` (``deit_tiny_patch16_224``, at a small size) and
``mobilenetv3.py`` (``mobilenetv3_large_100``): the same layers, names, registration order
and options. Where ``timm`` imports, the real
``timm.create_model`` is the target instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
mx = pytest.importorskip("mxnet")
torch = pytest.importorskip("torch")
from mxnet.gluon import nn as gnn  # noqa: E402
from port_helpers import check_port, gluon_randomize_bn, paddle_randomize_bn  # noqa: E402

from polytrain import port  # noqa: E402
from polytrain.errors import ConfigError  # noqa: E402

pnn, tnn = paddle.nn, torch.nn
CLASSES, SHAPE = 10, (2, 3, 64, 64)
WIDTHS = (64, 128, 256, 512)


def timm_or_twin(name: str) -> Any:
    """``timm.create_model(name)`` where timm imports, else the twin below."""
    try:
        import timm
    except Exception:  # ImportError, or torchvision's RuntimeError beside a CPU torch
        return TimmResNet(deep=name.endswith("d")).eval()
    return timm.create_model(name, num_classes=CLASSES).eval()


class TimmBasicBlock(tnn.Module):  # type: ignore[misc]
    def __init__(self, cin: int, cout: int, stride: int, avg_down: bool) -> None:
        super().__init__()
        self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1, self.act1 = tnn.BatchNorm2d(cout), tnn.ReLU()
        self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2, self.act2 = tnn.BatchNorm2d(cout), tnn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            pool = tnn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False)
            conv = tnn.Conv2d(cin, cout, 1, 1 if avg_down else stride, bias=False)
            parts = [pool, conv] if avg_down else [conv]
            self.downsample = tnn.Sequential(*parts, tnn.BatchNorm2d(cout))

    def forward(self, x: Any) -> Any:
        out = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act2(out + (x if self.downsample is None else self.downsample(x)))


class TimmResNet(tnn.Module):  # type: ignore[misc]
    """timm's ``ResNet`` with ``BasicBlock`` x 2 per stage: ``resnet18``, or with
    ``stem_type="deep"``, ``stem_width=32``, ``avg_down=True`` ``resnet18d``."""

    def __init__(self, deep: bool) -> None:
        super().__init__()
        if deep:
            self.conv1 = tnn.Sequential(
                tnn.Conv2d(3, 32, 3, 2, 1, bias=False), tnn.BatchNorm2d(32), tnn.ReLU(),
                tnn.Conv2d(32, 32, 3, 1, 1, bias=False), tnn.BatchNorm2d(32), tnn.ReLU(),
                tnn.Conv2d(32, 64, 3, 1, 1, bias=False),
            )  # fmt: skip
        else:
            self.conv1 = tnn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.act1 = tnn.BatchNorm2d(64), tnn.ReLU()
        self.maxpool = tnn.MaxPool2d(3, 2, 1)
        cin = 64
        for i, width in enumerate(WIDTHS):
            stride = 1 if i == 0 else 2
            blocks = [
                TimmBasicBlock(cin, width, stride, deep),
                TimmBasicBlock(width, width, 1, deep),
            ]
            setattr(self, f"layer{i + 1}", tnn.Sequential(*blocks))
            cin = width
        self.fc = tnn.Linear(512, CLASSES)

    def forward(self, x: Any) -> Any:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


class ConvBNLayer(pnn.Layer):  # type: ignore[misc]
    """PaddleClas' ``ConvBNLayer``: an ``AvgPool2D`` first in ``is_vd_mode``, a fluid-style
    ``BatchNorm``."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, vd: bool = False,
                 act: str | None = None) -> None:  # fmt: skip
        super().__init__()
        self.is_vd_mode, self.act = vd, act
        self.avg_pool = pnn.AvgPool2D(2, stride, padding="SAME", ceil_mode=True)
        self.conv = pnn.Conv2D(cin, cout, k, 1 if vd else stride, (k - 1) // 2, bias_attr=False)
        self.bn = pnn.BatchNorm(cout)
        self.relu = pnn.ReLU()

    def forward(self, x: Any) -> Any:
        x = self.bn(self.conv(self.avg_pool(x) if self.is_vd_mode else x))
        return self.relu(x) if self.act else x


class PaddleClasBasicBlock(pnn.Layer):  # type: ignore[misc]
    def __init__(self, cin: int, cout: int, stride: int, shortcut: bool, if_first: bool) -> None:
        super().__init__()
        self.conv0 = ConvBNLayer(cin, cout, 3, stride, act="relu")
        self.conv1 = ConvBNLayer(cout, cout, 3)
        if not shortcut:
            self.short = ConvBNLayer(cin, cout, 1, stride, vd=not if_first)
        self.shortcut = shortcut
        self.relu = pnn.ReLU()

    def forward(self, x: Any) -> Any:
        short = x if self.shortcut else self.short(x)
        return self.relu(self.conv1(self.conv0(x)) + short)


class PaddleClasResNetVd(pnn.Layer):  # type: ignore[misc]
    """PaddleClas ``ResNet18_vd(class_num=10, use_first_short_conv=...)``."""

    def __init__(self, use_first_short_conv: bool = True) -> None:
        super().__init__()
        stem = [(3, 32, 2), (32, 32, 1), (32, 64, 1)]
        self.stem = pnn.Sequential(*[ConvBNLayer(i, o, 3, s, act="relu") for i, o, s in stem])
        self.max_pool = pnn.MaxPool2D(3, 2, 1)
        blocks, cin = [], 64
        for stage, width in enumerate(WIDTHS):
            shortcut = not use_first_short_conv and stage == 0
            for i in range(2):
                stride = 2 if i == 0 and stage != 0 else 1
                first = stage == i == 0
                blocks.append(PaddleClasBasicBlock(cin, width, stride, shortcut, first))
                shortcut, cin = True, width
        self.blocks = pnn.Sequential(*blocks)
        self.avg_pool = pnn.AdaptiveAvgPool2D(1)
        self.flatten = pnn.Flatten()
        self.fc = pnn.Linear(512, CLASSES)

    def forward(self, x: Any) -> Any:
        x = self.avg_pool(self.blocks(self.max_pool(self.stem(x))))
        return self.fc(self.flatten(x))


class BasicBlockV1b(gnn.HybridBlock):  # type: ignore[misc]
    def __init__(self, planes: int, strides: int, downsample: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conv1 = gnn.Conv2D(planes, 3, strides, 1, use_bias=False)
        self.bn1, self.relu1 = gnn.BatchNorm(), gnn.Activation("relu")
        self.conv2 = gnn.Conv2D(planes, 3, 1, 1, use_bias=False)
        self.bn2, self.relu2 = gnn.BatchNorm(), gnn.Activation("relu")
        self.downsample = downsample

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + (x if self.downsample is None else self.downsample(x)))


class ResNetV1b(gnn.HybridBlock):  # type: ignore[misc]
    """gluon-cv ``resnet18_v1b(classes=10)``."""

    def __init__(self) -> None:
        super().__init__()
        with self.name_scope():
            self.conv1 = gnn.Conv2D(64, 7, 2, 3, use_bias=False)
            self.bn1, self.relu = gnn.BatchNorm(), gnn.Activation("relu")
            self.maxpool = gnn.MaxPool2D(3, 2, 1)
            inplanes = 64
            for stage, planes in enumerate(WIDTHS, start=1):
                strides = 1 if stage == 1 else 2
                layer = gnn.HybridSequential(prefix=f"layers{stage}_")
                with layer.name_scope():
                    down = None
                    if strides != 1 or inplanes != planes:
                        down = gnn.HybridSequential(prefix=f"down{stage}_")
                        down.add(gnn.Conv2D(planes, 1, strides, use_bias=False), gnn.BatchNorm())
                    layer.add(BasicBlockV1b(planes, strides, down), BasicBlockV1b(planes, 1, None))
                setattr(self, f"layer{stage}", layer)
                inplanes = planes
            self.avgpool, self.flat = gnn.GlobalAvgPool2D(), gnn.Flatten()
            self.fc = gnn.Dense(CLASSES, in_units=512)

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.flat(self.avgpool(x)))


def paddleclas_resnet18_vd(use_first_short_conv: bool = True) -> Any:
    paddle.seed(3)
    return paddle_randomize_bn(PaddleClasResNetVd(use_first_short_conv))


def gluoncv_resnet18_v1b() -> Any:
    mx.random.seed(3)
    model = ResNetV1b()
    model.initialize(mx.init.Xavier())
    model(mx.nd.zeros(SHAPE))  # the inferred input widths
    return gluon_randomize_bn(model)


@pytest.mark.slow
def test_paddleclas_resnet18_vd_ports_into_timm_resnet18d() -> None:
    """With ``use_first_short_conv=False`` (PaddleClas' option for the official layout)."""
    result = port(paddleclas_resnet18_vd(False), timm_or_twin("resnet18d"), input_shape=SHAPE)
    check_port(result, "paddleclas ResNet18_vd -> timm resnet18d")
    worst = max(row.relative for row in result.verification.rows[:-1])
    print(f"ZOO paddleclas ResNet18_vd: layers {len(result.pairs)}, worst {worst:.2g}, "
          f"logits {result.verification.rows[-1].relative:.2g}")  # fmt: skip


@pytest.mark.slow
def test_paddleclas_resnet18_vd_default_has_a_shortcut_conv_timm_has_not() -> None:
    """PaddleClas' default ``use_first_short_conv=True`` gives the first block a 1x1
    shortcut conv (64 -> 64) that timm's ``resnet18d`` has not: no pairing exists."""
    with pytest.raises(
        ConfigError, match=r"blocks\.0\.short\.conv.*layer1\.1\.conv1.*\[64, 64, 1, 1\]"
    ):
        port(paddleclas_resnet18_vd(), timm_or_twin("resnet18d"), input_shape=SHAPE)


@pytest.mark.slow
def test_gluoncv_resnet18_v1b_ports_into_timm_resnet18() -> None:
    result = port(gluoncv_resnet18_v1b(), timm_or_twin("resnet18"), input_shape=SHAPE)
    check_port(result, "gluon-cv resnet18_v1b -> timm resnet18")
    worst = max(row.relative for row in result.verification.rows[:-1])
    print(f"ZOO gluon-cv resnet18_v1b: layers {len(result.pairs)}, worst {worst:.2g}, "
          f"logits {result.verification.rows[-1].relative:.2g}")  # fmt: skip
    assert np.isfinite(worst)


VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
VIT_SHAPE = (2, 3, 32, 32)


def vit_or_twin(**options: Any) -> Any:
    """timm's ``deit_tiny_patch16_224`` (``VisionTransformer``) at the small ``VIT`` size."""
    try:
        import timm
    except Exception:  # as in timm_or_twin
        return TimmVisionTransformer().eval()
    kwargs = VIT | {"num_classes": CLASSES} | options
    return timm.create_model("deit_tiny_patch16_224", **kwargs).eval()


class TimmAttention(tnn.Module):  # type: ignore[misc]
    """timm's ``Attention``: one packed ``qkv`` Linear, scale head_dim ** -0.5 (fixed)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = tnn.Linear(dim, dim * 3, bias=True)
        self.q_norm, self.k_norm = tnn.Identity(), tnn.Identity()
        self.attn_drop, self.norm = tnn.Dropout(0.0), tnn.Identity()
        self.proj, self.proj_drop = tnn.Linear(dim, dim), tnn.Dropout(0.0)

    def forward(self, x: Any) -> Any:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class TimmMlp(tnn.Module):  # type: ignore[misc]
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = tnn.Linear(dim, hidden), tnn.GELU(), tnn.Linear(hidden, dim)

    def forward(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


class TimmBlock(tnn.Module):  # type: ignore[misc]
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = tnn.LayerNorm(dim, eps=1e-6)
        self.attn, self.ls1 = TimmAttention(dim, heads), tnn.Identity()
        self.norm2 = tnn.LayerNorm(dim, eps=1e-6)
        self.mlp, self.ls2 = TimmMlp(dim, 4 * dim), tnn.Identity()

    def forward(self, x: Any) -> Any:
        x = x + self.ls1(self.attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class TimmPatchEmbed(tnn.Module):  # type: ignore[misc]
    def __init__(self, patch: int, dim: int) -> None:
        super().__init__()
        self.proj, self.norm = tnn.Conv2d(3, dim, patch, patch), tnn.Identity()

    def forward(self, x: Any) -> Any:
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class TimmVisionTransformer(tnn.Module):  # type: ignore[misc]
    """timm's ``VisionTransformer`` as ``deit_tiny_patch16_224`` builds it (class token,
    ``qkv_bias``, LayerNorm eps 1e-6, exact GELU, token pooling), at the ``VIT`` size."""

    def __init__(self) -> None:
        super().__init__()
        dim, patches = VIT["embed_dim"], (VIT["img_size"] // VIT["patch_size"]) ** 2
        self.patch_embed = TimmPatchEmbed(VIT["patch_size"], dim)
        self.cls_token = tnn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = tnn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        blocks = [TimmBlock(dim, VIT["num_heads"]) for _ in range(VIT["depth"])]
        self.blocks = tnn.Sequential(*blocks)
        self.norm, self.fc_norm = tnn.LayerNorm(dim, eps=1e-6), tnn.Identity()
        self.head = tnn.Linear(dim, CLASSES)

    def forward(self, x: Any) -> Any:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.fc_norm(self.norm(self.blocks(x))[:, 0]))


class PaddleClasAttention(pnn.Layer):  # type: ignore[misc]
    """PaddleClas' ``Attention`` (``model_zoo/vision_transformer.py``): scale ``qk_scale``
    or head_dim ** -0.5."""

    def __init__(self, dim: int, heads: int, qkv_bias: bool, qk_scale: float | None) -> None:
        super().__init__()
        self.num_heads, self.scale = heads, qk_scale or (dim // heads) ** -0.5
        self.qkv = pnn.Linear(dim, dim * 3, bias_attr=qkv_bias)
        self.attn_drop = pnn.Dropout(0.0)
        self.proj, self.proj_drop = pnn.Linear(dim, dim), pnn.Dropout(0.0)

    def forward(self, x: Any) -> Any:
        n, c = x.shape[1:]
        qkv = self.qkv(x).reshape((-1, n, 3, self.num_heads, c // self.num_heads))
        qkv = qkv.transpose((2, 0, 3, 1, 4))
        attn = (qkv[0].matmul(qkv[1].transpose((0, 1, 3, 2)))) * self.scale
        attn = pnn.functional.softmax(attn, axis=-1)
        return self.proj(attn.matmul(qkv[2]).transpose((0, 2, 1, 3)).reshape((-1, n, c)))


class PaddleClasMlp(pnn.Layer):  # type: ignore[misc]
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act = pnn.Linear(dim, hidden), pnn.GELU()
        self.fc2, self.drop = pnn.Linear(hidden, dim), pnn.Dropout(0.0)

    def forward(self, x: Any) -> Any:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class PaddleClasBlock(pnn.Layer):  # type: ignore[misc]
    def __init__(self, dim: int, heads: int, mlp_ratio: float, eps: float, **attn: Any) -> None:
        super().__init__()
        self.norm1 = pnn.LayerNorm(dim, epsilon=eps)
        self.attn = PaddleClasAttention(dim, heads, **attn)
        self.norm2 = pnn.LayerNorm(dim, epsilon=eps)
        self.mlp = PaddleClasMlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(pnn.Layer):  # type: ignore[misc]
    """PaddleClas' ``VisionTransformer`` (``DeiT_tiny_patch16_224``: ``qkv_bias=True``,
    ``epsilon=1e-6``, mlp_ratio 4; ``ViT_small_patch16_224``: no qkv bias, ``qk_scale=
    768 ** -0.5``, mlp_ratio 3, epsilon 1e-5) at the ``VIT`` size."""

    def __init__(self, qkv_bias: bool = True, qk_scale: float | None = None,
                 mlp_ratio: float = 4, epsilon: float = 1e-6) -> None:  # fmt: skip
        super().__init__()
        dim, patch = VIT["embed_dim"], VIT["patch_size"]
        self.patch_embed = pnn.Layer()
        self.patch_embed.proj = pnn.Conv2D(3, dim, patch, patch)
        patches = (VIT["img_size"] // patch) ** 2
        self.pos_embed = self.create_parameter([1, patches + 1, dim])
        self.cls_token = self.create_parameter([1, 1, dim])
        self.pos_drop = pnn.Dropout(0.0)
        opts = {"qkv_bias": qkv_bias, "qk_scale": qk_scale}
        blocks = [PaddleClasBlock(dim, VIT["num_heads"], mlp_ratio, epsilon, **opts)
                  for _ in range(VIT["depth"])]  # fmt: skip
        self.blocks = pnn.LayerList(blocks)
        self.norm = pnn.LayerNorm(dim, epsilon=epsilon)
        self.head = pnn.Linear(dim, CLASSES)

    def forward(self, x: Any) -> Any:
        x = self.patch_embed.proj(x).flatten(2).transpose((0, 2, 1))
        x = paddle.concat((self.cls_token.expand((x.shape[0], -1, -1)), x), axis=1)
        x = self.pos_drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def paddleclas_vit(**options: Any) -> Any:
    paddle.seed(3)
    return paddle_randomize_bn(VisionTransformer(**options))


def test_paddleclas_deit_ports_into_timm_deit() -> None:
    """Packed ``qkv`` on both sides ([in, 3 * out] in Paddle, transposed), the class token
    and position embedding as the root's own tensors."""
    result = port(paddleclas_vit(), vit_or_twin(), input_shape=VIT_SHAPE)
    check_port(result, "paddleclas DeiT -> timm deit_tiny_patch16_224")
    worst = max(row.relative for row in result.verification.rows[:-1])
    print(f"ZOO paddleclas DeiT: layers {len(result.pairs)}, worst {worst:.2g}, "
          f"logits {result.verification.rows[-1].relative:.2g}")  # fmt: skip


def test_paddleclas_vit_small_scale_has_no_timm_twin() -> None:
    """PaddleClas' ``ViT_small_patch16_224`` scales the attention scores by ``qk_scale=
    768 ** -0.5`` (the embedding width, not head_dim ** -0.5, which timm's ``Attention``
    fixes): no tensor shows it, the verification stops at the first attention's output."""
    source = paddleclas_vit(qk_scale=VIT["embed_dim"] ** -0.5)
    result = port(source, vit_or_twin(), input_shape=VIT_SHAPE)
    assert not result.passed
    first = result.verification.first_failure
    assert first is not None and first.layer == "blocks.0.attn.proj", result.format()
    print(f"ZOO paddleclas ViT_small scale: fails at {first.layer}, relative {first.relative:.2g}")


# -- gluon-cv mobilenetv3_large -> timm mobilenetv3_large_100(head_bias=False) -------------

MBV3_LARGE = [  # gluon-cv's cfg: kernel, expanded, out, SE, activation, stride
    (3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1), (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hard_swish", 2), (3, 200, 80, False, "hard_swish", 1),
    (3, 184, 80, False, "hard_swish", 1), (3, 184, 80, False, "hard_swish", 1),
    (3, 480, 112, True, "hard_swish", 1), (3, 672, 112, True, "hard_swish", 1),
    (5, 672, 160, True, "hard_swish", 2), (5, 960, 160, True, "hard_swish", 1),
    (5, 960, 160, True, "hard_swish", 1),
]  # fmt: skip
TIMM_STAGES = [[0], [1, 2], [3, 4, 5], [6, 7, 8, 9], [10, 11], [12, 13, 14]]


def _divisible(x: float) -> int:  # gluon-cv's make_divisible: rounded up to 8
    return int(np.ceil(x / 8) * 8)


class GluonHardSwish(gnn.HybridBlock):  # type: ignore[misc]
    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return x * F.clip(x + 3.0, 0, 6) / 6.0


class GluonHardSigmoid(gnn.HybridBlock):  # type: ignore[misc]
    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return F.clip(x + 3.0, 0, 6) / 6.0


def _gluon_act(kind: str) -> Any:
    return gnn.Activation("relu") if kind == "relu" else GluonHardSwish()


class GluonSE(gnn.HybridBlock):  # type: ignore[misc]
    def __init__(self, num_out: int) -> None:
        super().__init__()
        self.pool = gnn.GlobalAvgPool2D()
        self.conv1 = gnn.Conv2D(_divisible(num_out // 4), 1, use_bias=True)
        self.act1, self.conv2 = gnn.Activation("relu"), gnn.Conv2D(num_out, 1, use_bias=True)
        self.act2 = GluonHardSigmoid()

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        out = self.act2(self.conv2(self.act1(self.conv1(self.pool(x)))))
        return F.broadcast_mul(x, out)


class GluonUnit(gnn.HybridBlock):  # type: ignore[misc]
    def __init__(self, out: int, k: int = 1, stride: int = 1, groups: int = 1,
                 act: str | None = "relu") -> None:  # fmt: skip
        super().__init__()
        self.conv = gnn.Conv2D(out, k, stride, k // 2, groups=groups, use_bias=False)
        self.bn, self.act = gnn.BatchNorm(), _gluon_act(act) if act else None

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        out = self.bn(self.conv(x))
        return self.act(out) if self.act is not None else out


class GluonResUnit(gnn.HybridBlock):  # type: ignore[misc]
    def __init__(self, num_in: int, cfg: tuple[Any, ...]) -> None:
        super().__init__()
        k, mid, out, se, act, stride = cfg
        self.first_conv, self.use_se = out != mid, se
        if self.first_conv:
            self.expand = GluonUnit(mid, act=act)
        self.conv1 = GluonUnit(mid, k, stride, groups=mid, act=act)
        if se:
            self.se = GluonSE(mid)
        self.conv2 = GluonUnit(out, act=None)
        self.short = num_in == out and stride == 1

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        out = self.conv1(self.expand(x) if self.first_conv else x)
        out = self.conv2(self.se(out) if self.use_se else out)
        return x + out if self.short else out


class GluonMobileNetV3(gnn.HybridBlock):  # type: ignore[misc]
    """gluon-cv ``mobilenetv3_large(classes=10)`` (``gluoncv/model_zoo/mobilenetv3.py``)."""

    def __init__(self) -> None:
        super().__init__()
        with self.name_scope():
            self.features = gnn.HybridSequential(prefix="")
            self.features.add(gnn.Conv2D(16, 3, 2, 1, use_bias=False), gnn.BatchNorm())
            self.features.add(GluonHardSwish())
            inplanes = 16
            for cfg in MBV3_LARGE:
                self.features.add(GluonResUnit(inplanes, cfg))
                inplanes = cfg[2]
            self.features.add(gnn.Conv2D(960, 1, use_bias=False), gnn.BatchNorm())
            self.features.add(GluonHardSwish(), gnn.GlobalAvgPool2D())
            self.features.add(gnn.Conv2D(1280, 1, use_bias=False), GluonHardSwish())
            self.features.add(gnn.Dropout(0.2))
            self.output = gnn.HybridSequential(prefix="output_")
            self.output.add(gnn.Conv2D(CLASSES, 1, in_channels=1280), gnn.Flatten())

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return self.output(self.features(x))


def _round_se(chs: float) -> int:  # timm's round_channels: to 8, at least 90 % of chs
    found = max(8, int(chs + 4) // 8 * 8)
    return found + 8 if found < 0.9 * chs else found


class TimmSE(tnn.Module):  # type: ignore[misc]
    def __init__(self, chs: int) -> None:
        super().__init__()
        rd = _round_se(chs * 0.25)
        self.conv_reduce, self.act1 = tnn.Conv2d(chs, rd, 1), tnn.ReLU()
        self.conv_expand = tnn.Conv2d(rd, chs, 1)

    def forward(self, x: Any) -> Any:
        se = self.conv_expand(self.act1(self.conv_reduce(x.mean((2, 3), keepdim=True))))
        return x * tnn.functional.hardsigmoid(se)


def _timm_act(kind: str) -> Any:
    return tnn.ReLU() if kind == "relu" else tnn.Hardswish()


class TimmDepthwiseSeparable(tnn.Module):  # type: ignore[misc]
    def __init__(self, chs: int, act: str) -> None:
        super().__init__()
        self.conv_dw = tnn.Conv2d(chs, chs, 3, 1, 1, groups=chs, bias=False)
        self.bn1, self.act1 = tnn.BatchNorm2d(chs), _timm_act(act)
        self.conv_pw, self.bn2 = tnn.Conv2d(chs, chs, 1, bias=False), tnn.BatchNorm2d(chs)

    def forward(self, x: Any) -> Any:
        return x + self.bn2(self.conv_pw(self.act1(self.bn1(self.conv_dw(x)))))


class TimmInvertedResidual(tnn.Module):  # type: ignore[misc]
    def __init__(self, cin: int, cfg: tuple[Any, ...]) -> None:
        super().__init__()
        k, mid, out, se, act, stride = cfg
        self.conv_pw, self.bn1 = tnn.Conv2d(cin, mid, 1, bias=False), tnn.BatchNorm2d(mid)
        self.conv_dw = tnn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False)
        self.bn2, self.act = tnn.BatchNorm2d(mid), _timm_act(act)
        self.se = TimmSE(mid) if se else tnn.Identity()
        self.conv_pwl, self.bn3 = tnn.Conv2d(mid, out, 1, bias=False), tnn.BatchNorm2d(out)
        self.skip = cin == out and stride == 1

    def forward(self, x: Any) -> Any:
        out = self.act(self.bn2(self.conv_dw(self.act(self.bn1(self.conv_pw(x))))))
        out = self.bn3(self.conv_pwl(self.se(out)))
        return x + out if self.skip else out


class TimmConvBnAct(tnn.Module):  # type: ignore[misc]
    def __init__(self, cin: int, out: int) -> None:
        super().__init__()
        self.conv, self.bn1 = tnn.Conv2d(cin, out, 1, bias=False), tnn.BatchNorm2d(out)

    def forward(self, x: Any) -> Any:
        return tnn.functional.hardswish(self.bn1(self.conv(x)))


class TimmMobileNetV3(tnn.Module):  # type: ignore[misc]
    """timm ``mobilenetv3_large_100(head_bias=False, num_classes=10)``
    (``timm/models/mobilenetv3.py``, ``_gen_mobilenet_v3``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_stem = tnn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(16)
        stages: list[Any] = [tnn.Sequential(TimmDepthwiseSeparable(16, "relu"))]
        cin = 16
        for stage in TIMM_STAGES[1:]:
            blocks = []
            for i in stage:
                blocks.append(TimmInvertedResidual(cin, MBV3_LARGE[i]))
                cin = MBV3_LARGE[i][2]
            stages.append(tnn.Sequential(*blocks))
        stages.append(tnn.Sequential(TimmConvBnAct(160, 960)))
        self.blocks = tnn.Sequential(*stages)
        self.conv_head = tnn.Conv2d(960, 1280, 1, bias=False)
        self.classifier = tnn.Linear(1280, CLASSES)

    def forward(self, x: Any) -> Any:
        x = self.blocks(tnn.functional.hardswish(self.bn1(self.conv_stem(x))))
        x = tnn.functional.hardswish(self.conv_head(x.mean((2, 3), keepdim=True)))
        return self.classifier(x.flatten(1))


def timm_mobilenetv3_large() -> Any:
    try:
        import timm
    except Exception:  # as timm_or_twin
        return TimmMobileNetV3().eval()
    return timm.create_model("mobilenetv3_large_100", num_classes=CLASSES, head_bias=False).eval()


def test_gluoncv_mobilenetv3_large_ports_into_timm_mobilenetv3_large_100() -> None:
    """Its classifier, a 1x1 Conv2D on the pooled map, into timm's Linear."""
    mx.random.seed(5)
    source = GluonMobileNetV3()
    source.initialize(mx.init.Xavier())
    source(mx.nd.zeros(SHAPE))
    result = port(gluon_randomize_bn(source), timm_mobilenetv3_large(), input_shape=SHAPE)
    check_port(result, "gluon-cv mobilenetv3_large -> timm mobilenetv3_large_100")
    head = next(p for p in result.pairs if p.target.name == "classifier")
    assert head.source.name == "output.0" and head.source.kind == "Conv2d"
    worst = max(row.relative for row in result.verification.rows[:-1])
    print(f"ZOO gluon-cv mobilenetv3_large: layers {len(result.pairs)}, worst {worst:.2g}, "
          f"logits {result.verification.rows[-1].relative:.2g}")  # fmt: skip
