"""What every optimizer shares: the learning-rate schedule, a trial's optimizer, the interface of an optimizer's
class, and the state of K trials packed in lockstep that its packed update works on. A packed update runs the lone
trial's torch kernels in their order, each trial with its own values, so that on CPU a packed trial equals a lone
one to the bit given the same gradients (tests/test_optimizers.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from edps_mlflow.coordinates import RAW_OF
from edps_mlflow.errors import EdpsError
from edps_mlflow.search import SearchSpace

if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class LearningRateSchedule:
    """A trial's learning rate, whatever its optimizer: a linear warm-up over ``warmup_steps`` (the update of step
    s + 1 uses (s + 1) / warmup_steps of the rate while s < warmup_steps) times, when ``decay_steps`` is set, a linear
    decay to ``learning_rate * end_learning_rate_factor`` over ``decay_steps`` steps, constant afterwards. Without
    either: constant (the paper's SGD schedule)."""

    learning_rate: float
    decay_steps: int | None = None
    end_learning_rate_factor: float = 1.0
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise EdpsError(f"warmup_steps must be a non-negative integer, got {self.warmup_steps}")

    @property
    def scheduled(self) -> bool:
        return self.decay_steps is not None or self.warmup_steps > 0

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of the update that produces step ``step + 1``."""
        rate = self.learning_rate
        if self.decay_steps is not None:
            fraction = min(step, self.decay_steps) / self.decay_steps
            rate = self.learning_rate * (1.0 - (1.0 - self.end_learning_rate_factor) * fraction)
        if step < self.warmup_steps:
            rate = rate * (step + 1) / self.warmup_steps
        return rate


SCHEDULE_METAPARAMETERS = tuple(f.name for f in fields(LearningRateSchedule))


@dataclass(frozen=True)
class TrialOptimizer:
    """One trial's optimizer: which one (``kind``), its own settings and its learning-rate schedule."""

    kind: "Optimizer"
    settings: Any
    schedule: LearningRateSchedule


@dataclass(frozen=True)
class Optimizer:
    """One registered optimizer. Its class sets ``settings_type`` (the frozen dataclass of its own metaparameters,
    floats), ``space`` (its default search space) and ``state_buffers`` (its state tensors per parameter), and
    writes the torch optimizer of a lone trial and the update of packed ones."""

    name: str
    settings_type: ClassVar[type]
    space: ClassVar[SearchSpace]
    state_buffers: ClassVar[int] = 0

    def trial(self, point: dict[str, float]) -> TrialOptimizer:
        """A trial's optimizer from its metaparameters: the schedule's and its own (any other is an error)."""
        own = [f.name for f in fields(self.settings_type)]
        # A batch-invariant coordinate is recorded beside the raw value it gave (coordinates.py), which is read.
        recorded = {name for name, raw in RAW_OF.items() if raw in point}
        unknown = sorted(set(point) - set(own) - set(SCHEDULE_METAPARAMETERS) - recorded)
        if unknown:
            raise EdpsError(f"{self.name} has no metaparameter {unknown[0]!r}; it takes "
                            f"{', '.join(SCHEDULE_METAPARAMETERS + tuple(own))}")
        decay = point.get("decay_steps")
        schedule = LearningRateSchedule(float(point["learning_rate"]), None if decay is None else int(decay),
                                        float(point.get("end_learning_rate_factor", 1.0)),
                                        int(point.get("warmup_steps", 0)))
        return TrialOptimizer(self, self.settings_type(**{n: float(point[n]) for n in own if n in point}), schedule)

    def torch_optimizer(self, parameters: list[Tensor], trial: TrialOptimizer) -> torch.optim.Optimizer:
        """A lone trial's optimizer (foreach), at the schedule's first rate."""
        raise NotImplementedError

    def packed_step(self, packed: "PackedState", params: dict[str, Tensor], gradients: dict[str, Tensor]) -> None:
        """One update of every packed trial, in place (``params`` and the masked ``gradients`` stacked per name)."""
        raise NotImplementedError


class PackedState:
    """What K packed trials hold of their optimizer: their settings and current rates, the state buffers (per
    parameter, stacked like it) and the count of updates; ``keep`` keeps the trials that train on."""

    def __init__(self, trials: Sequence[TrialOptimizer], params: dict[str, Tensor]) -> None:
        import torch  # here, as in the families' torch_optimizer: planning needs no torch

        self.settings = [trial.settings for trial in trials]
        self.rates = [trial.schedule.learning_rate for trial in trials]
        count = trials[0].kind.state_buffers
        self.buffers = {n: [torch.zeros_like(p) for _ in range(count)] for n, p in params.items()}
        self.updates = 0
        self.device = next(iter(params.values())).device
        self._columns: dict[str, Tensor] = {}

    def tensor(self, values: Sequence[float]) -> Tensor:
        import torch

        return torch.tensor(list(values), device=self.device)

    def column(self, name: str, value: Callable[[float, Any], float] | None = None) -> Tensor:
        """``value(rate, settings)`` per trial (by default the settings field ``name``; "rate": the learning rate),
        made once until the rates or the trials change."""
        if name not in self._columns:
            value = value or (lambda rate, settings: rate if name == "rate" else getattr(settings, name))
            self._columns[name] = self.tensor([value(r, s) for r, s in zip(self.rates, self.settings)])
        return self._columns[name]

    def set_rates(self, rates: Sequence[float]) -> None:
        self.rates, self._columns = list(rates), {}

    def keep(self, positions: Sequence[int]) -> None:
        index = self.tensor(positions)
        self.settings, self.rates = [self.settings[k] for k in positions], [self.rates[k] for k in positions]
        self.buffers = {n: [b.index_select(0, index) for b in buffers] for n, buffers in self.buffers.items()}
        self._columns = {}


def per_trial(values: Tensor, like: Tensor) -> Tensor:
    """One value per trial, shaped to broadcast against ``like`` (stacked on a leading trial axis)."""
    return values.reshape((-1,) + (1,) * (like.dim() - 1))
