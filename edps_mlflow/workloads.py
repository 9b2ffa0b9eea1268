"""The workload contract and the workload registry: name -> dataset, network and its initialisation, loss,
goal metric, input layout, goal, step cap, protocol defaults, search spaces.

The workload owns its objective, as AlgoPerf's workload contract does: the engine, SNIP and the probes
ask it for its ``loss`` and for its goal metric (``validation_total``: the count of wrong examples, or the
summed loss of a loss goal), initialise its network through its ``initialise``, and lay out its inputs
channels-last only when its ``input_layout`` says they are images. It owns its target too: the training
loop asks ``goal_bound`` and never hard-codes ``error <= goal``. It also owns its protocol defaults (trials
per study, check interval, goal and cap), which ``edps study``, ``edps sweep`` and the MLproject entries use
unless told otherwise, and it knows the sizes of its splits without loading any data, so that planning
never loads a dataset. docs/workloads.md documents the contract for workloads of one's own.

Where workloads come from (``get_workload``): the built-in ones (``WORKLOADS``); those that installed
packages declare in the entry-point group ``edps_mlflow.workloads``; and ``package.module:NAME``, a
Workload imported from a module on the import path, which this process then also finds by its name, and
so do the processes it starts (the reference travels in ``$EDPS_WORKLOAD_MODULES``).

Importing this module imports neither torch nor any dataset: networks and loaders are imported when
a workload builds or loads them.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from edps_mlflow import goal
from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers import OPTIMIZERS, get_optimizer
from edps_mlflow.search import (DECAY_STEPS, END_LEARNING_RATE_FACTOR, LEARNING_RATE, MOMENTUM, WEIGHT_DECAY, Dimension,
                                Scale, SearchSpace)

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from edps_mlflow.data.splits import DataSplits


# Trials per study in the paper (the original's `--nruns 100`).
PAPER_TRIALS = 100
# The paper's grid: its sparsities; batch sizes are the powers of two from 2 up to the split.
PAPER_SPARSITIES = (0.0, 0.5, 0.7, 0.9)
# The entry-point group through which an installed package offers workloads (docs/workloads.md).
ENTRY_POINT_GROUP = "edps_mlflow.workloads"
# ``package.module:NAME`` references imported in this process, for the processes it starts (pool workers,
# Ray workers, `mlflow run` processes), separated by commas.
MODULES_ENV = "EDPS_WORKLOAD_MODULES"
# A workload's name: part of every key, of experiment names and of tags; ``:`` marks a module reference.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class InputLayout(Enum):
    """What a workload's input tensors are (``DataSplits.train_images`` and ``validation_images``, whatever
    they hold). Only images are laid out channels-last: it is a memory format of 4-D tensors."""

    IMAGES = "images"  # [N, C, H, W] floats
    TOKENS = "tokens"  # [N, T] integer token ids
    FEATURES = "features"  # [N, D] floats


class GoalMetric(Enum):
    """What a workload's goal is a bound on, measured on the whole validation split at each check."""

    # The validation error: ``errors`` counts the wrong examples of a batch; the goal is met when their
    # rate is at most the goal (in (0, 1)), counted as the original does (goal.allowed_errors).
    ERROR_RATE = "error_rate"
    # The validation loss: ``loss_sum`` sums a batch's per-example losses (each >= 0); the goal is met when
    # their mean over the validation split is at most the goal (a positive number, e.g. nats per token).
    LOSS = "loss"


# (network outputs, targets) -> a 0-d tensor. Both run under torch.func.vmap in the packed engine (and the
# loss under grad too), so they use torch operations only: no .item(), no branch on a tensor's value.
Loss = Callable[["Tensor", "Tensor"], "Tensor"]
ErrorCount = Callable[["Tensor", "Tensor"], "Tensor"]
# (network, the trial's generator) -> None: sets every parameter from the generator (or deterministically).
Initialiser = Callable[["nn.Module", "torch.Generator"], None]


def cross_entropy(logits: "Tensor", labels: "Tensor") -> "Tensor":
    """The mean cross-entropy of a batch: the paper's loss. Outputs [N, C] with labels [N], or a sequence's
    [N, T, C] with [N, T] (the mean over every position)."""
    from torch.nn import functional as F

    if logits.dim() > 2:  # a sequence's positions, each an example of the mean
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return F.cross_entropy(logits, labels)


def cross_entropy_sum(logits: "Tensor", labels: "Tensor") -> "Tensor":
    """The summed per-example cross-entropy of a batch (of a sequence: its mean over the positions), the goal
    metric of a loss goal: over the validation split, its mean is the mean loss per position (nats)."""
    from torch.nn import functional as F

    positions = labels[0].numel() if labels.dim() > 1 else 1
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
    return total / positions


def argmax_errors(logits: "Tensor", labels: "Tensor") -> "Tensor":
    """How many examples of the batch are misclassified: their highest logit is not their label."""
    return (logits.argmax(-1) != labels).sum()


def fan_in_truncated_normal(model: "nn.Module", generator: "torch.Generator") -> None:
    """The paper's initialisation (models/init.py): Conv2d and Linear weights fan-in truncated normal, biases
    zero; other layers keep what their constructor set, deterministically."""
    from edps_mlflow.models import init_fan_in_truncated_normal

    init_fan_in_truncated_normal(model, generator)


@dataclass(frozen=True)
class Workload:
    """One workload: what the engine, SNIP and the probes ask about the problem they train
    (docs/workloads.md, "The workload contract"). Validated on construction: one line naming the workload
    and its first bad field."""

    name: str
    description: str
    load_data: Callable[[str | Path | None], "DataSplits"]
    build_model: Callable[[], "nn.Module"]
    # The default goal: an error rate in (0, 1), or a loss to reach (goal_metric).
    goal_error: float
    max_steps: int
    # True: the dataset is one of the data catalog's (data/catalog.py), in a data directory.
    needs_data_dir: bool
    dataset: str
    # Split sizes of the official data (the loaders check the real ones): planning needs no data.
    train_size: int
    validation_size: int
    # What its inputs are: channels-last only for images.
    input_layout: InputLayout
    # Its own search spaces, by optimizer name; an optimizer it does not name tunes in its default space.
    search_spaces: Mapping[str, SearchSpace] = field(default_factory=dict)
    # The mean training loss of a batch; SNIP's sensitivities and the probes' gradients are of it too.
    loss: Loss = cross_entropy
    # The number of wrong examples in a batch, at most its size: the validation error is their count over
    # the validation split's size, and the goal test (allowed_errors) counts them, stopping early and exactly.
    errors: ErrorCount = argmax_errors
    # Protocol defaults of a study on this workload.
    default_trials: int = 32
    check_interval: int = 100
    # Steps between probe calls (the Lipschitz constant's interval in the paper: 1,000).
    probe_interval: int = 1000
    # What the goal bounds: the error rate (``errors``) or the mean validation loss (``loss_sum``).
    goal_metric: GoalMetric = GoalMetric.ERROR_RATE
    # The summed per-example validation loss of a batch (each term >= 0, so that a partial sum only grows and
    # the goal test may stop early, exactly): the goal metric of a loss goal.
    loss_sum: Loss = cross_entropy_sum
    # Sets the network's initial parameters from the trial's seeded generator.
    initialise: Initialiser = fan_in_truncated_normal

    def __post_init__(self) -> None:
        def bad(field: str, problem: str) -> EdpsError:
            return EdpsError(f"workload {self.name!r}: {field} {problem}")

        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise bad("name", "must be 1-64 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
        for field in ("load_data", "build_model", "loss", "errors", "loss_sum", "initialise"):
            if not callable(getattr(self, field)):
                raise bad(field, "must be callable")
        if not isinstance(self.input_layout, InputLayout):
            raise bad("input_layout", f"must be an InputLayout, got {self.input_layout!r}")
        if not isinstance(self.goal_metric, GoalMetric):
            raise bad("goal_metric", f"must be a GoalMetric, got {self.goal_metric!r}")
        for field in ("max_steps", "train_size", "validation_size", "default_trials", "check_interval",
                      "probe_interval"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(field, f"must be a positive integer, got {value!r}")
        if self.max_steps < self.check_interval:
            raise bad("max_steps", f"({self.max_steps}) must be at least the check interval ({self.check_interval})")
        problem = self.goal_problem(self.goal_error)
        if problem:
            raise bad("goal_error", problem)
        if not all(isinstance(v, SearchSpace) for v in self.search_spaces.values()):
            raise bad("search_spaces", "must map optimizer names to SearchSpace values")
        unknown = sorted(set(self.search_spaces) - set(OPTIMIZERS))
        if unknown:
            raise bad("search_spaces", f"names unknown optimizers {', '.join(unknown)}; known: {', '.join(OPTIMIZERS)}")

    def goal_problem(self, goal_value: Any) -> str | None:
        """Why ``goal_value`` cannot be this workload's goal, or None."""
        if isinstance(goal_value, bool) or not isinstance(goal_value, (int, float)) or not math.isfinite(goal_value):
            return f"must be a finite number, got {goal_value!r}"
        if self.goal_metric is GoalMetric.ERROR_RATE and not 0.0 < goal_value < 1.0:
            return f"must be in (0, 1), got {goal_value}"
        if self.goal_metric is GoalMetric.LOSS and not goal_value > 0.0:
            return f"must be a positive loss, got {goal_value}"
        return None

    @property
    def goal_words(self) -> str:
        """What the goal bounds, in words: "validation error" or "validation loss"."""
        return "validation loss" if self.goal_metric is GoalMetric.LOSS else "validation error"

    def allowed_errors(self, goal_error: float, validation_size: int) -> int:
        """Most misclassified validation examples that still meet ``error <= goal_error``.

        As the original computes the error (float32 mean accuracy), not in exact arithmetic: at
        goal 0.12 on 6,000 images that is 719, not 720.
        """
        return goal.allowed_errors(goal_error, validation_size)

    def goal_bound(self, goal_value: float, validation_size: int) -> int | float:
        """The largest validation total (``validation_total`` summed over the split) that meets the goal:
        the allowed errors of an error-rate goal, ``goal * validation_size`` of a loss goal."""
        if self.goal_metric is GoalMetric.LOSS:
            return float(goal_value) * validation_size
        return self.allowed_errors(goal_value, validation_size)

    def validation_total(self, outputs: "Tensor", targets: "Tensor") -> "Tensor":
        """The goal metric of a batch as a sum over its examples: wrong examples, or summed loss."""
        if self.goal_metric is GoalMetric.LOSS:
            return self.loss_sum(outputs, targets)
        return self.errors(outputs, targets)

    def search_space(self, optimizer: str) -> SearchSpace:
        """What a study of ``optimizer`` tunes here: the workload's own space, else the optimizer's default."""
        return self.search_spaces[optimizer] if optimizer in self.search_spaces else get_optimizer(optimizer).space

    def require_data(self, data_dir: str | Path | None) -> None:
        """Refuse early, without loading anything, when the dataset's files are not there."""
        if self.needs_data_dir:
            from edps_mlflow.data.catalog import require_present

            require_present(self.dataset, data_dir)

    def data_fingerprint(self, data_dir: str | Path | None) -> str:
        """The fingerprint of the data this workload loads (data/fingerprint.py), cached for files."""
        from edps_mlflow.data.fingerprint import cached_fingerprint, splits_fingerprint

        if not self.needs_data_dir:
            from edps_mlflow.data.digits import digits_file

            bundled = digits_file() if self.dataset == "digits" else None
            if bundled is None:
                return splits_fingerprint(self.load_data(data_dir))
            return cached_fingerprint([bundled], lambda: self.load_data(data_dir), self.name)
        from edps_mlflow.data.catalog import dataset_files

        return cached_fingerprint(dataset_files(self.dataset, data_dir), lambda: self.load_data(data_dir), self.name)

    def largest_batch_size(self) -> int:
        """The largest power of two that fits the training split."""
        return 1 << (self.train_size.bit_length() - 1)

    def paper_grid(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The paper's grid on this workload: (batch sizes, sparsities)."""
        return self.batch_size_range(), PAPER_SPARSITIES

    def batch_size_range(self) -> tuple[int, ...]:
        """The powers of two from 2 to the largest that fits the training split."""
        return tuple(2 ** e for e in range(1, self.largest_batch_size().bit_length()))


def _digits_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=8, channels=(16, 32), kernel_size=3, padding=1)


def _mnist_model() -> "nn.Module":
    from edps_mlflow.models import SimpleCNN

    return SimpleCNN(in_channels=1, image_size=28, channels=(32, 64), kernel_size=5, padding=0)


def _resnet8() -> "nn.Module":
    from edps_mlflow.models.resnet8 import ResNet8

    return ResNet8()


def _digits_data(data_dir: str | Path | None) -> "DataSplits":
    from edps_mlflow.data.digits import load_digits_splits

    return load_digits_splits()


def _char_transformer() -> "nn.Module":
    from edps_mlflow.data.shakespeare import ALPHABET, CONTEXT
    from edps_mlflow.models.char_transformer import CharTransformer

    return CharTransformer(vocabulary=len(ALPHABET), context=CONTEXT, width=LM_WIDTH, depth=LM_DEPTH, heads=LM_HEADS)


def _init_char_transformer(model: "nn.Module", generator: "torch.Generator") -> None:
    from edps_mlflow.models.char_transformer import init_char_transformer

    init_char_transformer(model, generator)


def _catalog_data(dataset: str) -> Callable[[str | Path | None], "DataSplits"]:
    def load(data_dir: str | Path | None) -> "DataSplits":
        from edps_mlflow.data.catalog import load_dataset

        return load_dataset(dataset, data_dir)

    return load


def _paper_workload(name: str, dataset: str, description: str, build_model: Callable[[], "nn.Module"],
                    goal_error: float, max_steps: int, train_size: int, validation_size: int,
                    search_spaces: Mapping[str, SearchSpace] | None = None) -> Workload:
    """A workload of the paper: its dataset comes from the data catalog (a data directory)."""
    # The original's protocol: 100 trials per study (`--nruns 100`), a check every 100 steps.
    return Workload(name=name, description=description, load_data=_catalog_data(dataset), build_model=build_model,
                    goal_error=goal_error, max_steps=max_steps, search_spaces=search_spaces or {}, needs_data_dir=True,
                    dataset=dataset, train_size=train_size, validation_size=validation_size,
                    input_layout=InputLayout.IMAGES, default_trials=PAPER_TRIALS, check_interval=100)


# The character-level language model's network: small enough that a study runs on a CPU (docs/workloads.md
# has the measurements behind these choices).
LM_WIDTH, LM_DEPTH, LM_HEADS = 32, 2, 4
LM_GOAL, LM_MAX_STEPS, LM_TRIALS, LM_CHECK_INTERVAL = 2.2, 3000, 8, 25
# Its search spaces: Adam's learning rate on a range centred on 3e-3 (the first Sobol point), AdamW's weight
# decay too; no warm-up (a fixed warm-up adds the same steps at every batch size, and steps-to-result at large
# batch sizes is a few hundred). The other optimizers keep their default spaces.
LM_LEARNING_RATE = Dimension("learning_rate", 1e-4, 0.1, Scale.LOG)
LM_SPACES = {"adam": SearchSpace((LM_LEARNING_RATE,)), "adamw": SearchSpace((LM_LEARNING_RATE, WEIGHT_DECAY))}

WORKLOADS: dict[str, Workload] = {
    "digits-simple-cnn": Workload(
        name="digits-simple-cnn",
        description="scikit-learn's 8x8 digits (bundled, offline), a 6,090-parameter Simple-CNN variant",
        load_data=_digits_data,
        build_model=_digits_model,
        # 179 validation images: 0.03 allows 5 errors. Checks every 20 steps: dense studies reach the goal
        # in 60-80 steps from batch 64 on, so checks every 100 could not resolve the plateau; 32 trials,
        # because at sparsity 0.9 (609 weights left) only a few learning rates reach the goal at all and
        # 8 trials made the curve follow one noisy trajectory (docs/digits-workload.md).
        goal_error=0.03,
        max_steps=5000,
        needs_data_dir=False,
        dataset="digits",
        train_size=1618,
        validation_size=179,
        input_layout=InputLayout.IMAGES,
        default_trials=32,
        check_interval=20,
        # Best trials reach the goal within 60-300 steps: a probe every 10 steps (about 1 s for the
        # Lipschitz constant here) gives each of them several values along its run.
        probe_interval=10,
    ),
    "mnist-simple-cnn": _paper_workload(
        "mnist-simple-cnn", "mnist", "MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)", _mnist_model,
        goal_error=0.02, max_steps=40_000, train_size=54_000, validation_size=6_000),
    # 0.12 is not confirmed from the paper's text (Shallue et al. used 0.10).
    "fashion-mnist-simple-cnn": _paper_workload(
        "fashion-mnist-simple-cnn", "fashion-mnist", "Fashion-MNIST (54,000 / 6,000), Simple-CNN (62,346 parameters)",
        _mnist_model, goal_error=0.12, max_steps=40_000, train_size=54_000, validation_size=6_000),
    # The paper: the CIFAR-10 Nesterov workload also tunes the linear learning-rate decay.
    "cifar10-resnet8": _paper_workload(
        "cifar10-resnet8", "cifar10", "CIFAR-10 (45,000 / 5,000), ResNet-8 without batch norm (75,050 parameters)",
        _resnet8, goal_error=0.40, max_steps=100_000, train_size=45_000, validation_size=5_000,
        search_spaces={"nesterov": SearchSpace((LEARNING_RATE, MOMENTUM, DECAY_STEPS, END_LEARNING_RATE_FACTOR))}),
    # The goal is the validation cross-entropy in nats per character (on the first 1,024 windows of the last 10%
    # of the text, data/shakespeare.py); the sizes are those of the real file's windows of 32 characters.
    "shakespeare-char-transformer": Workload(
        name="shakespeare-char-transformer",
        description="Tiny Shakespeare, characters (31,370 / 1,024 windows of 32), a decoder-only transformer "
                    "(width 32, 2 blocks, 4 heads; 30,721 parameters); goal: validation loss, nats per character",
        load_data=_catalog_data("tiny-shakespeare"),
        build_model=_char_transformer,
        goal_error=LM_GOAL,
        max_steps=LM_MAX_STEPS,
        search_spaces=LM_SPACES,
        needs_data_dir=True,
        dataset="tiny-shakespeare",
        train_size=31_370,
        validation_size=1_024,
        input_layout=InputLayout.TOKENS,
        default_trials=LM_TRIALS,
        check_interval=LM_CHECK_INTERVAL,
        probe_interval=LM_CHECK_INTERVAL,
        goal_metric=GoalMetric.LOSS,
        initialise=_init_char_transformer,
    ),
}


# Workloads of this process that are not built in: imported from ``package.module:NAME`` references and
# entry points, by name (a cache of what was imported, as Python's own module cache).
_LOADED: dict[str, Workload] = {}
_BY_REFERENCE: dict[str, Workload] = {}


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
        return _register(_load_entry_point(offered[0]), f"entry point {offered[0].value}")
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
    item = _register(_as_workload(loaded, reference), reference)
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
    return item


def _environment_references() -> tuple[str, ...]:
    return tuple(part.strip() for part in os.environ.get(MODULES_ENV, "").split(",") if part.strip())
