"""The workload registry: the built-in workloads (one module each, one line in ``WORKLOADS``), those that installed
packages declare in the entry-point group ``edps_mlflow.workloads``, and ``package.module:NAME`` references, which
this process and those it starts (through ``$EDPS_WORKLOAD_MODULES``) then also find by name. Every name a workload
module of one's own needs is importable from here (docs/workloads.md, "The workload contract")."""

from __future__ import annotations

import importlib
import os
from typing import Any

from edps_mlflow.errors import EdpsError
from edps_mlflow.search import (ADAM_LEARNING_RATE, BETA2, DECAY_STEPS, END_LEARNING_RATE_FACTOR, LEARNING_RATE,
                                MOMENTUM, WEIGHT_DECAY, Dimension, Scale, SearchSpace)
from edps_mlflow.workloads.contract import (PAPER_SPARSITIES, ErrorCount, GoalMetric, Initialiser, InputLayout, Loss,
                                            Workload, argmax_errors, cross_entropy, cross_entropy_sum,
                                            fan_in_truncated_normal)
from edps_mlflow.workloads.digits import DIGITS
from edps_mlflow.workloads.paper import CIFAR10, FASHION_MNIST, MNIST
from edps_mlflow.workloads.shakespeare import SHAKESPEARE

__all__ = ["PAPER_SPARSITIES", "ErrorCount", "GoalMetric", "Initialiser", "InputLayout", "Loss", "Workload",
           "argmax_errors", "cross_entropy", "cross_entropy_sum", "fan_in_truncated_normal", "DataSplits",
           "split_indices", "SearchSpace", "Dimension", "Scale", "DEFAULT_SPACES", "PAPER_SPACES", "ADAM_SPACES",
           "LEARNING_RATE", "MOMENTUM", "DECAY_STEPS", "END_LEARNING_RATE_FACTOR", "ADAM_LEARNING_RATE",
           "WEIGHT_DECAY", "BETA2", "WORKLOADS", "get_workload", "workload_catalog", "workload_source"]
# Names imported when first asked for: data.splits loads torch (kept off `edps --help`); the spaces are built then.
_LAZY = {**dict.fromkeys(("DataSplits", "split_indices"), "edps_mlflow.data.splits"),
         **dict.fromkeys(("DEFAULT_SPACES", "PAPER_SPACES", "ADAM_SPACES"), "edps_mlflow.search")}

WORKLOADS: dict[str, Workload] = {item.name: item for item in (DIGITS, MNIST, FASHION_MNIST, CIFAR10, SHAKESPEARE)}
# The entry-point group through which an installed package offers workloads (docs/workloads.md).
ENTRY_POINT_GROUP = "edps_mlflow.workloads"
# ``package.module:NAME`` references imported in this process, comma-separated, for the processes it starts.
MODULES_ENV = "EDPS_WORKLOAD_MODULES"

# Workloads of this process that are not built in (from references and entry points), by name and by reference,
# and where each came from (``edps workloads`` says it).
_LOADED: dict[str, Workload] = {}
_BY_REFERENCE: dict[str, Workload] = {}
_SOURCES: dict[str, str] = {}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (built in, imported here before, named by a reference in
    ``$EDPS_WORKLOAD_MODULES``, or offered by an installed package's entry point), or the one that a
    ``package.module:NAME`` reference names. One line when there is none."""
    if not isinstance(name, str):
        raise EdpsError(f"a workload is named by a string, got {name!r}")
    if ":" in name:
        return _import_reference(name)
    if name in WORKLOADS:
        return WORKLOADS[name]
    if name in _LOADED:
        return _LOADED[name]
    for reference in _environment_references():
        if _import_reference(reference).name == name:
            return _LOADED[name]
    offered = [point for point in _entry_points() if point.name == name]
    if len(offered) > 1:
        raise EdpsError(f"workload {name!r} is offered by {len(offered)} installed entry points "
                        f"({', '.join(point.value for point in offered)}); uninstall all but one")
    if offered:
        return _register(_load_entry_point(offered[0]), _entry_point_source(offered[0]))
    known = ", ".join(sorted({*WORKLOADS, *_LOADED, *(point.name for point in _entry_points())}))
    raise EdpsError(f"unknown workload {name!r}; known workloads: {known} (a workload of your own: an entry point "
                    f"in the group {ENTRY_POINT_GROUP}, or --workload package.module:NAME; docs/workloads.md)")


def workload_catalog() -> list[tuple[str, Workload | EdpsError]]:
    """Every workload this process can find, by name: the built-in ones, then the imported and installed ones;
    a workload that cannot be loaded is listed with its error (``edps workloads`` prints it and goes on)."""
    found: dict[str, Workload | EdpsError] = dict(WORKLOADS)
    found.update(_LOADED)
    for reference in _environment_references():
        try:
            item = _import_reference(reference)
            found[item.name] = item
        except EdpsError as error:
            found[reference] = error
    for point in _entry_points():
        if point.name not in found:
            try:
                found[point.name] = get_workload(point.name)
            except EdpsError as error:
                found[point.name] = error
    return list(found.items())


def workload_source(item: Workload) -> str:
    """Where ``item`` came from, in words: "built in", "package <distribution> (<module>:<NAME>)" for an
    installed package's entry point, or "module <module>:<NAME>" for a reference."""
    return "built in" if WORKLOADS.get(item.name) is item else _SOURCES.get(item.name, "this process")


def _entry_point_source(point: Any) -> str:
    distribution = getattr(getattr(point, "dist", None), "name", None)
    return f"package {distribution} ({point.value})" if distribution else f"entry point {point.value}"


def _entry_points() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def _load_entry_point(point: Any) -> Workload:
    try:
        loaded = point.load()
    except Exception as error:  # the user's package: any import error is theirs, said in one line
        raise EdpsError(f"cannot load workload {point.name!r} from entry point {point.value}: "
                        f"{type(error).__name__}: {error}") from None
    item = _as_workload(loaded, f"entry point {point.value}")
    if item.name != point.name:
        raise EdpsError(f"entry point {point.name!r} ({point.value}) gives a workload named {item.name!r}: "
                        f"name the entry point as the workload")
    return item


def _import_reference(reference: str) -> Workload:
    """``package.module:NAME``: the Workload (or the function returning one) NAME of that module."""
    reference = reference.strip()
    if reference in _BY_REFERENCE:
        return _BY_REFERENCE[reference]
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise EdpsError(f"a workload reference is package.module:NAME, got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise EdpsError(f"cannot import {module_name!r} for the workload {reference!r}: {error} (the working "
                        f"directory is not on the import path: install the package, or add its directory to "
                        f"PYTHONPATH)") from None
    except Exception as error:
        raise EdpsError(f"importing {module_name!r} for the workload {reference!r} failed: "
                        f"{type(error).__name__}: {error}") from None
    try:
        loaded = getattr(module, attribute)
    except AttributeError:
        raise EdpsError(f"module {module_name!r} has no {attribute!r} (for the workload {reference!r})") from None
    item = _register(_as_workload(loaded, reference), f"module {reference}")
    _BY_REFERENCE[reference] = item
    references = _environment_references()
    if reference not in references:
        # The processes this one starts (pool workers, Ray workers, `mlflow run`) find it by its name too.
        os.environ[MODULES_ENV] = ",".join((*references, reference))
    return item


def _as_workload(loaded: Any, source: str) -> Workload:
    if callable(loaded) and not isinstance(loaded, Workload):
        try:
            loaded = loaded()
        except EdpsError:
            raise
        except Exception as error:
            raise EdpsError(f"building the workload of {source} failed: {type(error).__name__}: {error}") from None
    if not isinstance(loaded, Workload):
        raise EdpsError(f"{source} is a {type(loaded).__name__}, not an edps_mlflow.workloads.Workload")
    return loaded


def _register(item: Workload, source: str) -> Workload:
    if item.name in WORKLOADS and WORKLOADS[item.name] is not item:
        raise EdpsError(f"the workload of {source} is named {item.name!r}, the name of a built-in workload: "
                        f"give it a name of its own")
    previous = _LOADED.get(item.name)
    if previous is not None and previous is not item:
        raise EdpsError(f"two workloads are named {item.name!r} (the second from {source}): names must differ, "
                        f"they are part of every key")
    _LOADED[item.name] = item
    _SOURCES[item.name] = source
    return item


def _environment_references() -> tuple[str, ...]:
    return tuple(part.strip() for part in os.environ.get(MODULES_ENV, "").split(",") if part.strip())
