"""The user's own native model in a run: ``Recipe(model=module)`` with a torch ``nn.Module``,
a Paddle ``nn.Layer`` or a Gluon ``Block``, or ``--model pkg.module:factory`` whose factory
returns one (docs/user-models.md, "Your own native model").

:class:`RunModel` is what a run trains before it is built: a :class:`ModelSpec`, or such a
module of the backend's own framework. A module keeps its own initial weights; the data are
checked by a probe forward of one batch instead of the spec's ``input_shape`` and
``num_classes``; its checkpoints hold its tensors by parameter name (no spec), and a resume
calls the factory again (or takes the same object) and loads them. What needs a spec
(--fast, --inspect, --pipeline-split, parity dropout masks, several processes, ``polytrain
compare``) is one line. Which framework owns an object is asked of the backend plugins'
model walkers: the core never imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from polytrain.backend.precision import param_dtype
from polytrain.errors import ConfigError, DataError, PolytrainError
from polytrain.io.checkpoint import find_checkpoint, read_manifest
from polytrain.neutral.losses import check_targets
from polytrain.neutral.models import ModelSpec
from polytrain.neutral.spec_file import factory_result, is_factory_reference
from polytrain.plugins.registry import registered_model_walkers
from polytrain.training.build import build_model
from polytrain.training.compile_decision import CompileChoice, choose_for_run
from polytrain.training.data import Datasets, as_datasets
from polytrain.training.fit_checks import check_batch, check_names, check_run_fits
from polytrain.training.native_objects import NATIVE_PREFIX, native_framework, native_label
from polytrain.utils.user_code import traceback_hint

if TYPE_CHECKING:
    from polytrain.backend.base import Backend, Model
    from polytrain.distributed.cluster import ClusterInfo
    from polytrain.training.options import TrainerOptions
    from polytrain.training.recipe import Recipe
    from polytrain.training.step import StepRunner

SECTION = "docs/user-models.md, 'Your own native model'"


def needs_spec(recipe: Recipe, what: str) -> None:
    """One line when ``recipe``'s model is a native object or a factory that returns one:
    ``what`` (e.g. ``polytrain compare``) runs the same model on every backend."""
    model, found = recipe.model, recipe.model
    if is_factory_reference(model):
        found = factory_result(model)
    if isinstance(found, ModelSpec) or (isinstance(found, str) and found == model):
        return
    raise ConfigError(
        f"{what} runs one model on several backends, so it needs a ModelSpec, but the model "
        f"is {_shown(found)}: give a spec, or port the model (polytrain port writes its map "
        "and a spec) and compare that."
    )


def _shown(model: object) -> str:
    framework = native_framework(model)
    kind = type(model).__qualname__
    return f"a {framework} model ({kind})" if framework else f"a {kind}"


@dataclass
class RunModel:
    """A run's model before it is built: its spec, or the user's native module."""

    spec: ModelSpec | None
    native: Any = None

    @property
    def label(self) -> str:
        return self.spec.name if self.spec is not None else native_label(self.native)

    @classmethod
    def resolve(
        cls, recipe: Recipe, backend: Backend, options: TrainerOptions, cluster: ClusterInfo
    ) -> RunModel:
        """The recipe's model: a spec (on resume a factory's spec is the checkpoint's), or
        a native module of ``backend``'s framework, given or from the factory (called again
        on resume); anything a native model cannot do is one line."""
        from polytrain.training.checkpointing import model_spec_for

        model = recipe.model
        if isinstance(model, str) and model.startswith(NATIVE_PREFIX):
            raise ConfigError(
                f"The run's model was a native object passed from Python ({model}): resume "
                "it from Python with Trainer(recipe, resume=...) and the same object, or give "
                "--model pkg.module:factory returning it."
            )
        if is_factory_reference(model):
            saved = _saved_spec(options.resume)
            found = saved or factory_result(model)
            if isinstance(found, ModelSpec):
                return cls(found)
            what = f"--model {model!r}"
        elif isinstance(model, str | ModelSpec):
            return cls(model_spec_for(recipe, options.resume))
        else:
            found, what = model, "The recipe's model"
        run = cls(None, found)
        run.check_framework(backend, what)
        run.refuse_spec_features(recipe, backend, options, cluster)
        return run

    def check_framework(self, backend: Backend, what: str) -> None:
        """The module is one of ``backend``'s framework (one line naming both otherwise)."""
        framework = native_framework(self.native)
        if framework is None:
            walkers = ", ".join(registered_model_walkers())
            raise ConfigError(
                f"{what} gave a {type(self.native).__name__}, not a polytrain ModelSpec or a "
                f"native model of a framework polytrain wraps ({walkers}); see {SECTION}."
            )
        if framework != backend.framework:
            raise ConfigError(
                f"{what} is {_shown(self.native)}, but the {backend.name} backend trains "
                f"{backend.framework} models: train it with --backend {framework}, or give a "
                "ModelSpec to run it on any backend."
            )

    def refuse_spec_features(
        self, recipe: Recipe, backend: Backend, options: TrainerOptions, cluster: ClusterInfo
    ) -> None:
        """One line for the first option that needs a ModelSpec."""
        refused = [
            (bool(options.fast or backend.options.fast), "--fast compiles a ModelSpec's graph"),
            (options.inspect is not None, "--inspect reads the layers a ModelSpec names"),
            (bool(recipe.pipeline_split), "--pipeline-split cuts a ModelSpec's layers"),
            (recipe.dropout_masks == "parity", "--dropout-masks parity swaps a spec's dropout"),
            (cluster.is_distributed, "several processes start from a ModelSpec's seeded weights"),
        ]
        for on, why in refused:
            if on:
                raise ConfigError(
                    f"{why}; the model is {_shown(self.native)}, which runs without it: drop "
                    f"the option, or give a ModelSpec (see {SECTION})."
                )

    def datasets(self, given: Any, recipe: Recipe) -> Datasets:
        """The run's splits (``Trainer(datasets=...)`` or the recipe's), checked against a
        spec now; a native module's once it is built (:meth:`check_fits`)."""
        data = as_datasets(given, recipe, self.spec)
        if self.spec is not None:
            check_run_fits(recipe, self.spec, data.train)
        else:
            check_batch(recipe, len(data.train))
        return data

    def compile_choice(
        self, backend: Backend, recipe: Recipe, steps: int, options: TrainerOptions, *, auto: bool
    ) -> CompileChoice:
        """A spec's choice (:func:`choose_for_run`); a native module runs eager (a run that
        builds its backend says so to it)."""
        if self.spec is not None:
            inspect = options.inspect is not None
            return choose_for_run(
                backend, recipe, self.spec, steps, requested=options.fast, inspect=inspect,
                auto=auto,
            )  # fmt: skip
        if auto:
            backend.options.fast = False
        return CompileChoice(False, "your own native model runs eager")

    def build(self, backend: Backend, devices: list[Any], recipe: Recipe) -> Model:
        """A spec with the recipe seed's weights; a module on ``devices`` in the recipe's
        precision with its own weights kept; the backend's generator seeded (dropout)."""
        if self.spec is not None:
            return build_model(backend, self.spec, devices, recipe)
        model = backend.build_model(self.native, devices, dtype=param_dtype(recipe.precision))
        backend.seed(recipe.seed)
        return model

    def check_fits(
        self, recipe: Recipe, backend: Backend, model: Model, runner: StepRunner, data: Datasets
    ) -> None:
        """A native module's data checks (a spec's were made on loading): a probe forward
        of one batch gives its outputs per sample, which the targets must fit;
        --layer-weight-decay names its tensors."""
        if self.spec is not None:
            return
        check_names(recipe, list(backend.get_params(model)), self.label)
        shape = self.probe(runner, data.train.x[: recipe.batch_size])
        loss, metric = recipe.loss_spec(), recipe.metric_spec()
        outputs = shape[-1] if shape else 1
        for name, part in data.parts().items():
            where = part.source or f"the {name} set"
            if loss.class_targets:
                self.check_classes(part, outputs, where)
            check_targets(loss, metric, part.y, outputs, where, shape)

    def probe(self, runner: StepRunner, x: np.ndarray) -> tuple[int, ...]:
        """The module's output shape per sample for the batch ``x`` (eval mode)."""
        try:
            out = runner.predict(x)
        except PolytrainError:
            raise
        except Exception as exc:  # the framework's complaint, in one line
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise DataError(
                f"Model {self.label}: the probe forward of one batch of shape {list(x.shape)} "
                f"failed: {type(exc).__name__}: {said}{traceback_hint()}"
            ) from exc
        return tuple(int(n) for n in np.shape(out)[1:])

    def check_classes(self, part: Any, outputs: int, where: str) -> None:
        """The module's outputs per sample are the split's classes (its declared classes,
        or as many as its labels reach)."""
        y = part.y
        if y.dtype.kind not in "iu" or not len(y):
            return  # check_targets says what is wrong with them
        declared = getattr(part, "classes", None)
        classes = len(declared) if declared else int(y.max()) + 1
        if classes > outputs or (declared and classes != outputs):
            raise DataError(
                f"Model {self.label} gives {outputs} outputs per sample, but {where} has "
                f"{classes} classes (labels 0..{classes - 1}): make its last layer's output "
                f"size {classes}."
            )


def _saved_spec(resume: str | Path | None) -> ModelSpec | None:
    """The spec a resumed checkpoint stores (a factory's spec model), else None."""
    if resume is None:
        return None
    saved = (read_manifest(find_checkpoint(resume)).get("model") or {}).get("spec")
    return ModelSpec.from_dict(saved) if saved else None
