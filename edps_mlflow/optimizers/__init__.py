"""Optimizers: one module per family behind this registry, as pruning methods are. A family module (``sgd.py``,
``adam.py``, ``lion.py``) holds a ``base.Optimizer`` class per optimizer: its settings, its default search space, its
torch optimizer for a lone trial and its update of trials packed in lockstep. Adding one is a module and a line of
:data:`OPTIMIZERS`.

No module here imports torch at its top, so that listing a space's points, planning and validating need none: the
settings and spaces are plain data, a packed update uses only the methods of the tensors it is given, and torch is
imported where a torch optimizer or a packed state is built (tests/test_optimizers.py checks it)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from edps_mlflow.errors import EdpsError

if TYPE_CHECKING:
    from edps_mlflow.optimizers.base import Optimizer

# Name (a study's ``optimizer``, hashed into its keys) -> its class (``module:Class``) and what it is.
OPTIMIZERS: dict[str, tuple[str, str]] = {
    "sgd": ("edps_mlflow.optimizers.sgd:Sgd", "plain SGD (the paper's)"),
    "momentum": ("edps_mlflow.optimizers.sgd:Momentum", "heavy-ball momentum, as torch.optim.SGD (the paper's)"),
    "nesterov": ("edps_mlflow.optimizers.sgd:Nesterov", "Nesterov momentum, as torch.optim.SGD (the paper's)"),
    "adam": ("edps_mlflow.optimizers.adam:Adam", "torch.optim.Adam"),
    "adamw": ("edps_mlflow.optimizers.adam:AdamW", "torch.optim.AdamW (decoupled weight decay)"),
    "lion": ("edps_mlflow.optimizers.lion:Lion", "the sign of an interpolated momentum (Chen et al. 2023)"),
}


def optimizer_names() -> tuple[str, ...]:
    return tuple(OPTIMIZERS)


def parse_optimizer(name: object) -> str:
    """A registered optimizer's name, or one EdpsError naming the known ones."""
    if isinstance(name, str) and name in OPTIMIZERS:
        return str(name)
    raise EdpsError(f"unknown optimizer {name!r}; known optimizers: {', '.join(OPTIMIZERS)}")


def get_optimizer(name: str) -> "Optimizer":
    """The optimizer called ``name`` (imports its family module)."""
    module_name, _, class_name = OPTIMIZERS[parse_optimizer(name)][0].partition(":")
    return getattr(importlib.import_module(module_name), class_name)(name)
