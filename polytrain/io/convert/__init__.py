"""Convert weights between the registered native formats (PyTorch .pt, Paddle .pdparams,
MXNet .params, ...) and neutral checkpoints, without the frameworks (a format whose
writing needs its framework, like .pt, says so). ``polytrain convert IN OUT --to FORMAT``.

Canonical names and layout are PyTorch's. A :class:`NameMap` says, for one format, which
native tensor holds each canonical one and whether it is stored transposed. The maps of
the built-in models follow from the spec and the format's
:class:`~polytrain.backend.native_format.LayoutRules`, declared by its plugin (see each
backend's ``_format.py``); they agree with what each backend's ``save_native`` writes
and ``load_native`` reads: PyTorch identical (plus ``num_batches_tracked``, and without
DDP's ``module.``), Paddle with Linear weights [in, out] and BatchNorm ``_mean`` /
``_variance``, MXNet with BatchNorm ``gamma`` / ``beta``.

For your own model, give a JSON map (``--map FILE``, or :func:`load_map` in Python; the
syntax is in :mod:`polytrain.io.name_map`): keys are canonical names (your PyTorch model's
state-dict names), entries exact, prefix or regex, each giving the native name and/or
the layout. A map may be partial: its entries are merged over the built-in map (with
``--model``) or the generic rules. It describes the non-canonical side of a conversion;
to convert between two non-canonical formats give one per format (``{"paddle": {...},
"mxnet": {...}}``). :func:`plan_map` (``--print-map``) gives the map the tool would use.

The generic rules, for a model that is none of the built-in ones: canonical formats and
neutral as they are; the others with their leaf renames undone. Where a format stores
some layer kind's weights transposed, a 2-D tensor's layout is decided by what its layer
is, from the map or from what the file itself records (the plugin's
:meth:`~polytrain.backend.native_format.NativeFormat.layer_kinds`), never from a name or
a shape; without that evidence the conversion stops with one message naming the tensors.

The package, each module importing only those after it:
:mod:`~polytrain.io.convert.conversion` (``convert``, ``plan_map``),
:mod:`~polytrain.io.convert.writing`, :mod:`~polytrain.io.convert.reading` (a model's
map, or the generic one of :mod:`~polytrain.io.convert.generic_write` /
:mod:`~polytrain.io.convert.generic_read`), :mod:`~polytrain.io.convert.planning` (which
map each side uses; every layout decided) and :mod:`~polytrain.io.convert.rules` (one
format's naming and layout rule, both ways, from its plugin's table; built-in maps).
"""

from __future__ import annotations

from polytrain.io.convert.conversion import (
    ConvertReport,
    conversion_inputs,
    convert,
    plan_map,
)
from polytrain.io.convert.reading import Weights, read_weights, read_weights_with_map
from polytrain.io.convert.rules import DTYPES, NameRule, builtin_map, targets
from polytrain.io.convert.writing import write_weights
from polytrain.io.name_map import MapEntry, NameMap, load_map

__all__ = [
    "DTYPES",
    "ConvertReport",
    "MapEntry",
    "NameMap",
    "NameRule",
    "Weights",
    "builtin_map",
    "conversion_inputs",
    "convert",
    "load_map",
    "plan_map",
    "read_weights",
    "read_weights_with_map",
    "targets",
    "write_weights",
]
