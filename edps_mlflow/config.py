"""Frozen configuration of a study and its trials, validation, and content keys.

A key is the sha256 of the canonical JSON of everything that changes a result, plus the results
version (:data:`RESULTS_VERSION`, not the package's), so that a measurement can always be found again
and is never trained twice by accident.
Fields that change only the cost (the early-stopping mode, the number of worker processes, the
packing factor) are deliberately left out of the keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from edps_mlflow.errors import EdpsError
from edps_mlflow.fields import key_fields
from edps_mlflow.optimizers import OptimizerName, get_optimizer
from edps_mlflow.pruning import DEFAULT_METHOD, method_info, parse_method
from edps_mlflow.workloads import InputLayout, get_workload

if TYPE_CHECKING:
    from edps_mlflow.optimizers.base import TrialOptimizer


class Schedule(str, Enum):
    """The order in which a study's chunks of trials train. Either gives the same trials the same
    batches and updates and the study the same result; only the cost differs."""

    # Every chunk advances one check interval at a time, the one furthest behind first: the study costs
    # about what proving its minimum costs, whatever the trial order.
    BREADTH_FIRST = "breadth_first"
    # Each chunk trains to its end before the next starts (the cost depends on finding the best early).
    DEPTH_FIRST = "depth_first"


# Probes a study may ask for (their code is in probes.py, which needs torch; the names do not).
PROBE_NAMES = ("lipschitz", "noise_scale")


class ProbeTrials(str, Enum):
    """Which trials of a study are measured by its probes. A probed trial trains its whole run (to its
    goal, the cap or divergence) whatever the early-stopping mode, as the original measures."""

    # The study trains (or reuses) its trials without probes, then trains its best trial again, with the
    # probes, to its goal. The same trajectory: probes never touch the training state.
    BEST = "best"
    # Every trial probes, so every trial trains its whole run (the cost of --full-trials and the probes').
    ALL = "all"

    @classmethod
    def parse(cls, name: str) -> "ProbeTrials":
        try:
            return cls(name)
        except ValueError:
            raise EdpsError(f"unknown probe trials {name!r}; choose {' or '.join(k.value for k in cls)}") from None

# What the engine can represent: step counters and caps are far below 2**63 with this bound, and
# the shared best step of worker processes is a signed 64-bit integer.
MAX_STEP_CAP = 10**9
SEED_LIMIT = 2**32


def parse_probes(text: str | None) -> tuple[str, ...]:
    """``lipschitz,noise_scale`` -> a sorted tuple of probe names (unknown names are an error)."""
    return _checked_probes(tuple(part.strip() for part in (text or "").split(",") if part.strip()))


def _checked_probes(names: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in PROBE_NAMES]
    if unknown:
        raise EdpsError(f"unknown probe {unknown[0]!r}; known probes: {', '.join(PROBE_NAMES)}")
    return tuple(sorted(set(names)))


def _check_count(name: str, value: int, low: int = 1, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
        raise EdpsError(f"{name} must be {kind}, got {value!r}")
    if high is not None and value > high:
        raise EdpsError(f"{name} must be at most {high:,}, got {value!r}")


@dataclass(frozen=True)
class StudySpec:
    """Everything that defines one study: (workload, optimizer, sparsity, batch size) and its search.

    Validated on construction: a StudySpec that exists is a valid one.
    """

    workload: str
    optimizer: OptimizerName
    sparsity: float
    batch_size: int
    trials: int
    goal_error: float
    max_steps: int
    check_interval: int
    seed: int
    # Measurements during training (probes.py). They do not change the result, but a study asked
    # for them must not reuse trials measured without them, so they enter the keys when present.
    probes: tuple[str, ...] = ()
    probe_interval: int = 1000
    # Which trials the probes measure (only meaningful with probes). ``best`` enters the key; ``all``
    # does not, so that studies probed before this choice existed keep their keys (they are found
    # again only in the whole-run mode, see trains_whole_runs).
    probe_trials: ProbeTrials = ProbeTrials.ALL
    # TF32 matmuls and convolutions on GPUs that have them (off: full FP32, as the original). It can
    # change results, so it enters the keys when on.
    allow_tf32: bool = False
    # sha256 of the data loaded (data/fingerprint.py), set once the data are known. Studies and
    # sweeps always set it, so two different copies of a dataset never share keys; a spec without
    # it has the key that runs made before fingerprints had (still readable by the analysis).
    data_fingerprint: str | None = None
    # The pruning method at initialisation (pruning/: its registry). "snip", the paper's, is left out of the
    # keys, so every study measured before methods existed keeps its key. Nothing is pruned at sparsity 0,
    # whatever the method: the dense study is spelled "snip" there, one study for every method's curve.
    pruning: str = DEFAULT_METHOD

    def __post_init__(self) -> None:
        """Raise EdpsError with one clear sentence for the first bad value; normalise the rest."""
        # The one validation of a batch size (a sweep's grid is validated by the studies it holds): a
        # positive integer no larger than the workload's training split.
        workload = get_workload(self.workload)
        # A ``package.module:NAME`` reference keys as the workload's own name, as an entry point's does.
        object.__setattr__(self, "workload", workload.name)
        _check_count("batch size", self.batch_size)
        if self.batch_size > workload.train_size:
            raise EdpsError(f"batch size {self.batch_size} exceeds the {workload.train_size} training examples of "
                            f"{workload.name}")
        if not isinstance(self.sparsity, (int, float)) or isinstance(self.sparsity, bool) \
                or not (0.0 <= self.sparsity < 1.0):
            raise EdpsError(f"sparsity must be in [0, 1), got {self.sparsity}")
        goal_problem = workload.goal_problem(self.goal_error)
        if goal_problem is not None:  # an error rate in (0, 1), or a positive loss (the workload's goal metric)
            raise EdpsError(f"goal {workload.goal_words.split()[-1]} {goal_problem}"
                            + (f" ({workload.name} sets a {workload.goal_words} to reach)" if
                               workload.goal_words.endswith("loss") else ""))
        _check_count("trials", self.trials, 1, 100_000)
        _check_count("check interval", self.check_interval, 1, MAX_STEP_CAP)
        _check_count("max steps", self.max_steps, 1, MAX_STEP_CAP)
        if self.max_steps < self.check_interval:
            raise EdpsError(
                f"max steps ({self.max_steps}) must be at least the check interval ({self.check_interval})"
            )
        _check_count("seed", self.seed, 0, SEED_LIMIT - 1)
        _check_count("probe interval", self.probe_interval, 1, MAX_STEP_CAP)
        # -0.0 is 0.0: the same study must get the same key however the number was spelled.
        object.__setattr__(self, "sparsity", float(self.sparsity) + 0.0)
        object.__setattr__(self, "goal_error", float(self.goal_error))
        object.__setattr__(self, "optimizer", OptimizerName(self.optimizer))
        object.__setattr__(self, "probes", _checked_probes(tuple(self.probes)))
        object.__setattr__(self, "probe_trials", ProbeTrials.parse(self.probe_trials)
                           if not isinstance(self.probe_trials, ProbeTrials) else self.probe_trials)
        if not self.probes:  # the choice means nothing without probes: one spelling of the plain study
            object.__setattr__(self, "probe_trials", ProbeTrials.ALL)
        object.__setattr__(self, "allow_tf32", bool(self.allow_tf32))
        pruning = parse_method(self.pruning)
        object.__setattr__(self, "pruning", DEFAULT_METHOD if self.sparsity == 0.0 else pruning)
        if method_info(pruning).needs_continuous_inputs and workload.input_layout is InputLayout.TOKENS:
            raise EdpsError(f"{pruning} feeds the network an all-ones input; workload {workload.name} takes token "
                            f"ids: choose another pruning method")
        if self.data_fingerprint is not None and not (
                isinstance(self.data_fingerprint, str) and len(self.data_fingerprint) == 64
                and all(c in "0123456789abcdef" for c in self.data_fingerprint)):
            raise EdpsError(f"data fingerprint must be 64 hex digits, got {self.data_fingerprint!r}")

    @classmethod
    def build(cls, workload: str, optimizer: str, sparsity: float, batch_size: int,
              trials: int | None = None, goal_error: float | None = None, max_steps: int | None = None,
              check_interval: int | None = None, seed: int = 0, probes: tuple[str, ...] = (),
              probe_interval: int | None = None, allow_tf32: bool = False,
              probe_trials: ProbeTrials | str = ProbeTrials.BEST, pruning: str = DEFAULT_METHOD,
              **fields: Any) -> "StudySpec":
        """A study with the workload's protocol (trials, goal, cap, check and probe intervals) wherever a
        value is None; any other field as given (``fields``)."""
        item, optimizer = get_workload(workload), OptimizerName(optimizer)
        return cls(workload, optimizer, sparsity, batch_size, trials if trials is not None else item.default_trials,
                   goal_error if goal_error is not None else item.goal_error,
                   max_steps if max_steps is not None else item.max_steps,
                   check_interval if check_interval is not None else item.check_interval, seed, probes,
                   probe_interval if probe_interval is not None else item.probe_interval,
                   allow_tf32=allow_tf32, probe_trials=probe_trials, pruning=pruning, **fields)

    def key_fields(self) -> dict[str, Any]:
        """The fields hashed into the keys (fields.STUDY_FIELDS: those at their key default are left out,
        so a field added with its default leaves every old key as it was)."""
        return key_fields(self)

    @property
    def study_key(self) -> str:
        return content_key({"kind": "study", **self.key_fields()})

    @property
    def trains_whole_runs(self) -> bool:
        """Every trial probes, so none is cut short by exact early stopping."""
        return bool(self.probes) and self.probe_trials is ProbeTrials.ALL

    def full_trials(self, requested: bool) -> bool:
        """Whether this study trains every trial to its own end: when asked, or when every trial probes. The
        store tells the two modes apart (a study done in one is not done in the other)."""
        return requested or self.trains_whole_runs

    @property
    def probes_best_only(self) -> bool:
        return bool(self.probes) and self.probe_trials is ProbeTrials.BEST

    @property
    def training_spec(self) -> "StudySpec":
        """The study whose trials are trained and reused: without probes when only the best trial probes,
        so that such a study shares every trial with the plain study."""
        return replace(self, probes=(), probe_trials=ProbeTrials.ALL) if self.probes_best_only else self

    @property
    def probe_spec(self) -> "StudySpec":
        """The study whose trials carry the probes: a best-only study's probed re-run of its best trial is
        the trial of the all-trials study with the same key (and either reuses the other's)."""
        return replace(self, probe_trials=ProbeTrials.ALL)

    @property
    def result_key(self) -> str:
        """The key of the measurement itself (probes never change a trajectory or a result): studies that
        differ only in their probes share it, and the analysis counts them once."""
        return replace(self, probes=(), probe_trials=ProbeTrials.ALL).study_key

    def trial_seed(self, trial_index: int) -> int:
        """Each trial has its own initialisation seed (hence its own mask, and pruning scores shared by every
        study of the grid: pruning/cache.py)."""
        return int(np.random.SeedSequence([self.seed, trial_index]).generate_state(1)[0])


@dataclass(frozen=True)
class TrialSpec:
    """One point of the search with its seed, inside a study."""

    study: StudySpec
    index: int
    metaparameters: dict[str, float] = field(hash=False)

    @property
    def init_seed(self) -> int:
        return self.study.trial_seed(self.index)

    @property
    def optimizer(self) -> "TrialOptimizer":
        """Its optimizer: settings and schedule from its metaparameters (imports the optimizer, and torch)."""
        return get_optimizer(self.study.optimizer).trial(self.metaparameters)

    @property
    def trial_key(self) -> str:
        # The trial count is not part of a trial's identity: a study with more trials reuses the
        # trials of a smaller one with the same settings.
        study_fields = {k: v for k, v in self.study.key_fields().items() if k != "trials"}
        return content_key(
            {
                "kind": "trial",
                **study_fields,
                "metaparameters": {k: float(v) for k, v in sorted(self.metaparameters.items())},
                "init_seed": self.init_seed,
            }
        )


# The version of what a key's result means, hashed into every key. It changes only when a spec that keeps
# its key would get a different result: a change to the engine, the initialisation, SNIP, the batch order,
# the goal test or the search points (tests/test_results_version.py fingerprints them and says when). A
# package release leaves it alone, so the store keeps every measurement across releases. Bumping it re-keys
# the whole store (every study is trained again): do it only when the old results are wrong for the new code.
# It equals the package version keys hashed before it existed ("0.1.0"), so those keys stand.
RESULTS_VERSION = "0.1.0"


def content_key(fields: dict[str, Any]) -> str:
    # The JSON field is still called "version", as when it held the package version: the same keys.
    canonical = json.dumps({**fields, "version": RESULTS_VERSION}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def study_family(spec: StudySpec) -> str:
    """Everything of a study but its trial count: trials of such studies can be shared."""
    return content_key({"kind": "study-family", **{k: v for k, v in spec.key_fields().items() if k != "trials"}})


def trial_families(spec: StudySpec) -> list[str]:
    """The study families of the trial runs a study creates: its training study's (StudySpec.training_spec),
    and for a study that probes only its best trial, the all-trials study's (its probed re-run)."""
    families = [study_family(spec.training_spec)]
    if spec.probes_best_only:
        families.append(study_family(spec.probe_spec))
    return list(dict.fromkeys(families))
