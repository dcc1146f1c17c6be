"""The built-in models (``--model NAME``): the networks of the tutorials polytrain ports
and of its recipes, by name in :data:`MODELS`."""

from __future__ import annotations

from collections.abc import Callable

from polytrain.errors import ConfigError
from polytrain.neutral.models.layers import (
    GELU,
    Add,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool2d,
    LayerNorm,
    Linear,
    MaxPool2d,
    Mean,
    MultiHeadSelfAttention,
    PositionalEmbedding,
    ReLU,
    Reshape,
    Residual,
    Sequential,
    Transpose,
    seq,
)
from polytrain.neutral.models.spec import ModelSpec


def lenet(init: str = "xavier_uniform") -> ModelSpec:
    """d2l's LeNet of the multi-GPU chapters: conv 1->20 k3, avgpool, conv 20->50 k5,
    avgpool, dense 800->128, dense 128->10, ReLU between."""
    return ModelSpec(
        "lenet",
        seq(
            ("conv1", Conv2d(1, 20, 3)),
            ("relu1", ReLU()),
            ("pool1", AvgPool2d(2, 2)),
            ("conv2", Conv2d(20, 50, 5)),
            ("relu2", ReLU()),
            ("pool2", AvgPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc1", Linear(800, 128)),
            ("relu3", ReLU()),
            ("fc2", Linear(128, 10)),
        ),
        init=init,
        description="d2l multi-GPU LeNet (1.3e5 parameters)",
    )


def lenet_scratch() -> ModelSpec:
    """The same LeNet with d2l's scratch initialisation N(0, 0.01), biases zero."""
    spec = lenet(init="normal")
    return ModelSpec(**{**spec.__dict__, "name": "lenet-scratch"})


def paddle_mnist() -> ModelSpec:
    """The Paddle MNIST tutorial's CNN: conv 20 k5 p2, maxpool, conv 20 k5 p2, maxpool,
    dense 980->10 (the tutorial's softmax is part of the loss here)."""
    return ModelSpec(
        "paddle-mnist",
        seq(
            ("conv1", Conv2d(1, 20, 5, padding=2)),
            ("relu1", ReLU()),
            ("pool1", MaxPool2d(2, 2)),
            ("conv2", Conv2d(20, 20, 5, padding=2)),
            ("relu2", ReLU()),
            ("pool2", MaxPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc", Linear(980, 10)),
        ),
        init="fan_in_uniform",
        description="Paddle MNIST tutorial CNN",
    )


def torch_dp_cnn() -> ModelSpec:
    """The PyTorch DataParallel tutorial's CNN: conv 64, conv 128, maxpool,
    dense 25088->1024, dropout 0.5, dense 10."""
    return ModelSpec(
        "torch-dp-cnn",
        seq(
            ("conv1", Conv2d(1, 64, 3, padding=1)),
            ("relu1", ReLU()),
            ("conv2", Conv2d(64, 128, 3, padding=1)),
            ("relu2", ReLU()),
            ("pool", MaxPool2d(2, 2)),
            ("flatten", Flatten()),
            ("fc1", Linear(14 * 14 * 128, 1024)),
            ("relu3", ReLU()),
            ("dropout", Dropout(0.5)),
            ("fc2", Linear(1024, 10)),
        ),
        init="fan_in_uniform",
        has_randomness=True,
        description="PyTorch DataParallel tutorial CNN (dropout: no cross-framework parity)",
    )


def mlp(hidden: int = 32) -> ModelSpec:
    """A small MLP (flatten, dense, relu, dense) whose gradients numpy checks exactly."""
    return ModelSpec(
        "mlp",
        seq(
            ("flatten", Flatten()),
            ("fc1", Linear(784, hidden)),
            ("relu1", ReLU()),
            ("fc2", Linear(hidden, 10)),
        ),
        init="xavier_uniform",
        description="two-layer perceptron",
    )


def _residual(cin: int, cout: int, stride: int) -> Residual:
    body = seq(
        ("conv1", Conv2d(cin, cout, 3, stride=stride, padding=1)),
        ("bn1", BatchNorm2d(cout)),
        ("relu", ReLU()),
        ("conv2", Conv2d(cout, cout, 3, padding=1)),
        ("bn2", BatchNorm2d(cout)),
    )
    shortcut = None
    if stride != 1 or cin != cout:
        shortcut = seq(("conv", Conv2d(cin, cout, 1, stride=stride)))
    return Residual(body, shortcut)


def resnet18(num_classes: int = 10, in_channels: int = 1) -> ModelSpec:
    """d2l's ResNet-18 of the multi-GPU chapter: 3x3 stem, no max-pool, four stages
    64/128/256/512 of two residual blocks (1x1 conv shortcut when the shape changes),
    global average pool, dense."""
    stages = []
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        blocks = seq(("0", _residual(cin, cout, stride)), ("1", _residual(cout, cout, 1)))
        stages.append((f"stage{i + 1}", blocks))
        cin = cout
    return ModelSpec(
        "resnet18",
        seq(
            ("conv1", Conv2d(in_channels, 64, 3, padding=1)),
            ("bn1", BatchNorm2d(64)),
            ("relu", ReLU()),
            *stages,
            ("pool", GlobalAvgPool2d()),
            ("flatten", Flatten()),
            ("fc", Linear(512, num_classes)),
        ),
        input_shape=(in_channels, 28, 28),
        num_classes=num_classes,
        init="normal",  # the seed's init_weights: N(0, 0.01) for every conv and linear
        init_std=0.01,
        description="d2l ResNet-18 variant with BatchNorm (1.1e7 parameters)",
    )


def _vit_block(width: int, heads: int, hidden: int) -> Sequential:
    """A pre-norm encoder block: ``x + attn(ln1(x))``, then ``+ mlp(ln2(.))`` (GELU)."""
    attention = seq(("ln", LayerNorm((width,))), ("attn", MultiHeadSelfAttention(width, heads)))
    mlp = seq(
        ("ln", LayerNorm((width,))),
        ("fc1", Linear(width, hidden)),
        ("gelu", GELU()),
        ("fc2", Linear(hidden, width)),
    )
    return seq(("attn", Add((seq(), attention))), ("mlp", Add((seq(), mlp))))


def vit_tiny(depth: int = 2, width: int = 64, heads: int = 4, mlp_ratio: int = 2) -> ModelSpec:
    """A small Vision Transformer for 28x28 images: 7x7 patches (a stride-7 Conv2d) to 16
    tokens of width 64, learned positions, ``depth`` pre-norm blocks of 4-head
    self-attention and a GELU MLP, a final LayerNorm, the tokens' mean (no class token:
    the global-average-pooled variant of "Better plain ViT baselines") and a Linear head."""
    tokens = (28 // 7) ** 2
    blocks = seq(*((str(i), _vit_block(width, heads, mlp_ratio * width)) for i in range(depth)))
    spec = ModelSpec(
        "vit-tiny",
        seq(
            ("patch", Conv2d(1, width, 7, stride=7)),
            ("tokens", Reshape((width, tokens))),
            ("to_tokens", Transpose(1, 2)),
            ("pos", PositionalEmbedding(tokens, width)),
            ("blocks", blocks),
            ("norm", LayerNorm((width,))),
            ("pool", Mean(1)),
            ("head", Linear(width, 10)),
        ),
        init="xavier_uniform",
    )
    about = (
        f"Vision Transformer: 7x7 patches, 16 tokens x {width}, {depth} pre-norm blocks "
        f"({heads} heads, MLP {mlp_ratio * width}), mean pool ({spec.num_parameters():,} "
        "parameters)"
    )
    return ModelSpec(**{**spec.__dict__, "description": about})


def _pre_norm_block(width: int, heads: int) -> Sequential:
    """``x + attn(ln(x))`` then ``x + fc2(gelu(fc1(ln(x))))`` (GPT-2's block, no dropout)."""
    attention = seq(
        ("ln", LayerNorm((width,))), ("attn", MultiHeadSelfAttention(width, heads, causal=True))
    )
    mlp = seq(
        ("ln", LayerNorm((width,))),
        ("fc1", Linear(width, 4 * width)),
        ("gelu", GELU()),
        ("fc2", Linear(4 * width, width)),
    )
    return seq(("attention", Add((seq(), attention))), ("mlp", Add((seq(), mlp))))


def char_transformer(
    vocab_size: int = 88, context: int = 64, width: int = 64, heads: int = 4, blocks: int = 2
) -> ModelSpec:
    """A character-level causal transformer LM: ids [N, T] -> next-id logits [N, T, V].
    The default vocabulary is the ``fortunes`` corpus's 88 characters."""
    net = seq(
        ("embed", Embedding(vocab_size, width)),
        ("pos", PositionalEmbedding(context, width)),
        *((f"block{i}", _pre_norm_block(width, heads)) for i in range(blocks)),
        ("ln", LayerNorm((width,))),
        ("head", Linear(width, vocab_size)),
    )
    return ModelSpec(
        name="char-transformer",
        net=net,
        input_shape=(context,),
        num_classes=vocab_size,
        init="normal",  # GPT-2's N(0, 0.02) for every weight; biases zero
        init_std=0.02,
        description=f"causal transformer LM, {blocks} pre-norm blocks of width {width}, "
        f"{heads} heads, context {context}, {vocab_size} characters",
    )


MODELS: dict[str, Callable[[], ModelSpec]] = {
    "lenet": lenet,
    "lenet-scratch": lenet_scratch,
    "paddle-mnist": paddle_mnist,
    "torch-dp-cnn": torch_dp_cnn,
    "mlp": mlp,
    "resnet18": resnet18,
    "char-transformer": char_transformer,
    "vit-tiny": vit_tiny,
}


def get_model_spec(name: str) -> ModelSpec:
    """A built-in spec by name; unknown names list the known ones."""
    try:
        return MODELS[name]()
    except KeyError:
        raise ConfigError(
            f"Unknown model {name!r}. Built-in models: {', '.join(MODELS)}; or your own: "
            "pkg.module:factory, or a spec file (.json, .toml)."
        ) from None
