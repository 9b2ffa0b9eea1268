"""The workload contract: what the engine, the pruning methods and the probes ask of the problem they train. As in
AlgoPerf, the workload owns its objective (loss, goal metric, initialisation, input layout), its target
(``goal_bound``: the loop never hard-codes ``error <= goal``), its protocol defaults and its split sizes, so that
planning never loads data. docs/workloads.md documents it for workloads of one's own. No torch at import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from edps_mlflow import goal
from edps_mlflow.coordinates import Coordinates, invariant_space
from edps_mlflow.errors import EdpsError
from edps_mlflow.optimizers import OPTIMIZERS, get_optimizer
from edps_mlflow.search import SearchSpace

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from edps_mlflow.data.splits import DataSplits

# The paper's grid: its sparsities; batch sizes are the powers of two from 2 up to the split.
PAPER_SPARSITIES = (0.0, 0.5, 0.7, 0.9)
# A workload's name: part of every key, of experiment names and of tags; ``:`` marks a module reference.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class InputLayout(Enum):
    """What a workload's inputs (``DataSplits.train_images`` and ``validation_images``) are: only images are laid
    out channels-last, a memory format of 4-D tensors."""

    IMAGES = "images"  # [N, C, H, W] floats
    TOKENS = "tokens"  # [N, T] integer token ids
    FEATURES = "features"  # [N, D] floats


class GoalMetric(Enum):
    """What a workload's goal is a bound on, measured on the whole validation split at each check."""

    # The validation error: ``errors`` counts a batch's wrong examples; met when their rate is at most the goal
    # (in (0, 1)), counted as the original does (goal.allowed_errors).
    ERROR_RATE = "error_rate"
    # The validation loss: ``loss_sum`` sums a batch's per-example losses (each >= 0); met when their mean over
    # the validation split is at most the goal (a positive number, e.g. nats per token).
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
    """One workload (docs/workloads.md, "The workload contract"). Validated on construction: one line naming the
    workload and its first bad field."""

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
    # The number of wrong examples in a batch, at most its size (the goal test counts them, stopping early).
    errors: ErrorCount = argmax_errors
    # Protocol defaults of a study on this workload.
    default_trials: int = 32
    check_interval: int = 100
    # Steps between probe calls (the Lipschitz constant's interval in the paper: 1,000).
    probe_interval: int = 1000
    # What the goal bounds: the error rate (``errors``) or the mean validation loss (``loss_sum``).
    goal_metric: GoalMetric = GoalMetric.ERROR_RATE
    # The summed per-example validation loss of a batch (each term >= 0, so the goal test may stop early).
    loss_sum: Loss = cross_entropy_sum
    # Sets the network's initial parameters from the trial's seeded generator.
    initialise: Initialiser = fan_in_truncated_normal

    def __post_init__(self) -> None:
        def bad(field: str, problem: str) -> EdpsError:
            return EdpsError(f"workload {self.name!r}: {field} {problem}")

        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise bad("name", "must be 1-64 of a-z, 0-9, '.', '_' or '-', starting with a letter or digit")
        for name in ("load_data", "build_model", "loss", "errors", "loss_sum", "initialise"):
            if not callable(getattr(self, name)):
                raise bad(name, "must be callable")
        for name in ("description", "dataset"):
            if not isinstance(getattr(self, name), str):
                raise bad(name, f"must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.needs_data_dir, bool):
            raise bad("needs_data_dir", f"must be True or False, got {self.needs_data_dir!r}")
        if not isinstance(self.input_layout, InputLayout):
            raise bad("input_layout", f"must be an InputLayout, got {self.input_layout!r}")
        if not isinstance(self.goal_metric, GoalMetric):
            raise bad("goal_metric", f"must be a GoalMetric, got {self.goal_metric!r}")
        for name in ("max_steps", "train_size", "validation_size", "default_trials", "check_interval",
                     "probe_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, f"must be a positive integer, got {value!r}")
        if self.max_steps < self.check_interval:
            raise bad("max_steps", f"({self.max_steps}) must be at least the check interval ({self.check_interval})")
        problem = self.goal_problem(self.goal_error)
        if problem:
            raise bad("goal_error", problem)
        if not isinstance(self.search_spaces, Mapping) or not all(isinstance(v, SearchSpace)
                                                                  for v in self.search_spaces.values()):
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
        """Most misclassified validation examples that still meet the goal, as the original counts (goal.py)."""
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

    def search_space(self, optimizer: str, coordinates: Coordinates = Coordinates.RAW,
                     batch_size: int = 1) -> SearchSpace:
        """What a study of ``optimizer`` tunes here: the workload's own space, else the optimizer's default; in
        batch-invariant coordinates at ``batch_size`` when asked (coordinates.py)."""
        kind = get_optimizer(optimizer)
        space = self.search_spaces.get(optimizer, kind.space)
        if coordinates is Coordinates.RAW:
            return space
        settings = {f.name for f in fields(kind.settings_type)}
        return invariant_space(space, optimizer, settings, batch_size, self.train_size)

    def require_data(self, data_dir: str | Path | None) -> None:
        """Refuse early, without loading anything, when the dataset's files are not there."""
        if self.needs_data_dir:
            from edps_mlflow.data.catalog import require_present

            require_present(self.dataset, data_dir)

    def load_checked(self, data_dir: str | Path | None) -> "DataSplits":
        """``load_data``'s splits, refused in one line naming the workload where they break the contract
        (``splits_problem``): before any training, and before a sweep plans with their fingerprint."""
        data = self.load_data(data_dir)
        problem = splits_problem(self, data)
        if problem:
            raise EdpsError(f"workload {self.name!r}: {problem}")
        return data

    def data_fingerprint(self, data_dir: str | Path | None) -> str:
        """The fingerprint of the data this workload loads (data/fingerprint.py), cached for files."""
        from edps_mlflow.data.fingerprint import cached_fingerprint, splits_fingerprint

        if not self.needs_data_dir:
            from edps_mlflow.data.digits import digits_file

            bundled = digits_file() if self.dataset == "digits" else None
            if bundled is None:
                return splits_fingerprint(self.load_checked(data_dir))
            return cached_fingerprint([bundled], lambda: self.load_checked(data_dir), self.name)
        from edps_mlflow.data.catalog import dataset_files

        return cached_fingerprint(dataset_files(self.dataset, data_dir), lambda: self.load_checked(data_dir), self.name)

    def largest_batch_size(self) -> int:
        """The largest power of two that fits the training split."""
        return 1 << (self.train_size.bit_length() - 1)

    def batch_size_range(self) -> tuple[int, ...]:
        """The powers of two from 2 to the largest that fits the training split."""
        return tuple(2 ** e for e in range(1, self.largest_batch_size().bit_length()))

    def paper_grid(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The paper's grid on this workload: (batch sizes, sparsities)."""
        return self.batch_size_range(), PAPER_SPARSITIES


def splits_problem(workload: Workload, data: Any) -> str | None:
    """What is wrong with ``data`` as ``workload``'s splits (docs/workloads.md, "What is checked"), or None. Cheap:
    types, shapes and dtypes, never values."""
    import torch

    from edps_mlflow.data.splits import DataSplits

    if not isinstance(data, DataSplits):
        return f"load_data must return a DataSplits, got a {type(data).__name__}"
    for part in ("train", "validation"):
        inputs, targets = getattr(data, f"{part}_images"), getattr(data, f"{part}_labels")
        if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
            return f"the {part} inputs and targets must be torch tensors"
        rank, dtype = _LAYOUT_INPUTS[workload.input_layout]
        if inputs.dim() != rank or inputs.dtype != getattr(torch, dtype):
            return (f"{part} inputs are {str(inputs.dtype).removeprefix('torch.')} of shape {list(inputs.shape)}; "
                    f"{workload.input_layout.name} inputs are {rank}-D {dtype}")
        if targets.dim() < 1 or len(targets) != len(inputs):
            return f"{part} has {len(inputs)} inputs but targets of shape {list(targets.shape)}"
        if workload.loss is cross_entropy and targets.dtype != torch.int64:
            return (f"{part} targets are {str(targets.dtype).removeprefix('torch.')}; the default loss "
                    f"(cross_entropy) takes int64 class indices")
    # A catalog dataset's files are the catalog's to check (edps data list); the sizes of data a workload brings
    # itself are its own declaration, which planning trusts (batch sizes up to the split).
    for part, word, declared, loaded in (("train", "training", workload.train_size, data.train_size),
                                         ("validation", "validation", workload.validation_size, data.validation_size)):
        if not workload.needs_data_dir and declared != loaded:
            return (f"declares {part}_size={declared:,} but load_data gave {loaded:,} {word} examples: set "
                    f"{part}_size={loaded}")
    return None


# Each input layout's tensors: (dimensions, dtype); the networks' parameters are float32.
_LAYOUT_INPUTS = {InputLayout.IMAGES: (4, "float32"), InputLayout.TOKENS: (2, "int64"),
                  InputLayout.FEATURES: (2, "float32")}
