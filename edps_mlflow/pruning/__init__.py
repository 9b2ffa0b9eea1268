"""Pruning at initialisation: the registry of methods (one module each, OpenLTH's ``pruning/registry.py``) and
what they prune. Each method scores a freshly initialised network and cuts the scores into a mask (base.py);
``shuffle(<method>)`` permutes a method's mask within each tensor. docs/pruning.md defines every method.

No torch here: the study spec validates a method's name with this module, and tracking logs what it prunes.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from edps_mlflow.errors import EdpsError

if TYPE_CHECKING:
    from edps_mlflow.pruning.base import Method


class Prunes(str, Enum):
    """Which parameters a method may prune; the others are always kept."""

    WEIGHTS_AND_BIASES = "weights and biases"  # SNIP, as the paper's code prunes
    WEIGHTS = "weights"  # tensors of two or more dimensions, as every other method's reference code


class Scope(str, Enum):
    """How a method's scores are cut into a mask."""

    GLOBAL = "global"  # one top-k over every prunable entry: k = round(N (1 - sparsity)), N the prunable count
    LAYER_WISE = "layer-wise"  # a top-k per tensor: each tensor keeps its own count (the method's densities)


@dataclass(frozen=True)
class MethodInfo:
    """One pruning method as the registry knows it (no torch). ``strategy``: ``module:Class``; ``data``: what its
    scores look at; ``cached``: its scores are costly, so kept (``cache.py``), per sparsity when
    ``sparsity_dependent``; ``needs_continuous_inputs``: it feeds the network an all-ones input."""

    name: str
    strategy: str
    prunes: Prunes
    scope: Scope
    data: str
    summary: str
    cached: bool = False
    sparsity_dependent: bool = False
    needs_continuous_inputs: bool = False
    # shuffle(<base>): the base method's name (the mask it permutes); None for a method of its own.
    base: str | None = None


# The paper's method, and the key default (a SNIP study's key does not name the method).
DEFAULT_METHOD = "snip"

METHODS: dict[str, MethodInfo] = {info.name: info for info in (
    MethodInfo("snip", "edps_mlflow.pruning.snip:Snip", Prunes.WEIGHTS_AND_BIASES, Scope.GLOBAL,
               "the whole training split", "|theta * dL/dtheta| summed over batches of 100 (Lee et al. 2019)",
               cached=True),
    MethodInfo("random", "edps_mlflow.pruning.random_layerwise:RandomLayerwise", Prunes.WEIGHTS, Scope.LAYER_WISE,
               "none", "uniformly random, every prunable tensor keeping the same fraction"),
    MethodInfo("random-erk", "edps_mlflow.pruning.random_erk:RandomErk", Prunes.WEIGHTS, Scope.LAYER_WISE,
               "none", "uniformly random within each tensor, Erdos-Renyi-Kernel densities (Evci et al. 2020)"),
    MethodInfo("magnitude", "edps_mlflow.pruning.magnitude:Magnitude", Prunes.WEIGHTS, Scope.GLOBAL,
               "none", "|theta| at initialisation"),
    MethodInfo("grasp", "edps_mlflow.pruning.grasp:GraSP", Prunes.WEIGHTS, Scope.GLOBAL,
               "a class-balanced sample of the training split (10 per class)",
               "-theta * (H g) at temperature 200; the highest scores pruned (Wang et al. 2020)", cached=True),
    MethodInfo("synflow", "edps_mlflow.pruning.synflow:SynFlow", Prunes.WEIGHTS, Scope.GLOBAL,
               "none (an all-ones input)",
               "|theta * dR/dtheta| of the network with |theta|, 100 rounds on the exponential schedule "
               "(Tanaka et al. 2020)", cached=True, sparsity_dependent=True, needs_continuous_inputs=True),
)}

SHUFFLE_PREFIX, SHUFFLE_SUFFIX = "shuffle(", ")"


def method_names() -> list[str]:
    """Every method name a study takes: the registered ones, then their shuffles."""
    return list(METHODS) + [shuffled(name) for name in METHODS]


def shuffled(name: str) -> str:
    return f"{SHUFFLE_PREFIX}{name}{SHUFFLE_SUFFIX}"


def parse_method(text: str) -> str:
    """A method's canonical name (``Shuffle( SNIP )`` -> ``shuffle(snip)``), or one EdpsError naming the known ones."""
    if not isinstance(text, str):
        raise EdpsError(f"a pruning method is a name, got {text!r}")
    name = "".join(text.split()).lower()
    if name.startswith(SHUFFLE_PREFIX) and name.endswith(SHUFFLE_SUFFIX):
        base = name[len(SHUFFLE_PREFIX):-len(SHUFFLE_SUFFIX)]
        if base in METHODS:
            return shuffled(base)
    elif name in METHODS:
        return name
    raise EdpsError(f"unknown pruning method {text!r}; known methods: {', '.join(METHODS)}, or shuffle(<method>) "
                    f"for a method's mask permuted within each tensor")


def parse_methods(text: str | None) -> tuple[str, ...]:
    """``snip,random,shuffle(snip)`` -> the canonical names in order (commas inside parentheses belong to them)."""
    names = [parse_method(part) for part in re.split(r",(?![^(]*\))", text or "") if part.strip()]
    if not names:
        raise EdpsError("name at least one pruning method, e.g. snip,random")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise EdpsError(f"pruning methods repeat a value: {', '.join(repeated)}")
    return tuple(names)


def method_info(name: str) -> MethodInfo:
    """The registry line of a method (a shuffle's: its base's, less the caching of its own scores)."""
    name = parse_method(name)
    if name in METHODS:
        return METHODS[name]
    base = METHODS[name[len(SHUFFLE_PREFIX):-len(SHUFFLE_SUFFIX)]]
    return replace(base, name=name, strategy="edps_mlflow.pruning.shuffle:Shuffle", scope=Scope.LAYER_WISE,
                   summary=f"{base.name}'s mask, its kept entries permuted uniformly within each tensor "
                           f"(Frankle et al. 2021)", base=base.name)


def get_method(name: str) -> "Method":
    """The strategy of a method (imports torch and the method's module)."""
    info = method_info(name)
    module_name, _, class_name = info.strategy.partition(":")
    strategy = getattr(importlib.import_module(module_name), class_name)
    return strategy(info)

