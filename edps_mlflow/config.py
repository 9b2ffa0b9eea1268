"""A study and its trials as frozen, validated specs, and their content keys: the sha256 of the canonical JSON of
everything that changes a result (fields.py says which fields) and :data:`RESULTS_VERSION`, so that a measurement
is always found again and never trained twice. What changes only the cost (early stopping, workers, packing) is
left out."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from edps_mlflow.coordinates import Coordinates, parse_coordinates
from edps_mlflow.errors import EdpsError
from edps_mlflow.names import goals_text
from edps_mlflow.fields import key_fields
from edps_mlflow.optimizers import get_optimizer, parse_optimizer
from edps_mlflow.parameterization import Parameterization, parse_parameterization
from edps_mlflow.pruning import DEFAULT_METHOD, method_info, parse_method
from edps_mlflow.workloads import InputLayout, Workload, get_workload

if TYPE_CHECKING:
    from edps_mlflow.optimizers.base import TrialOptimizer
    from edps_mlflow.search import SearchSpace


class Schedule(str, Enum):
    """The order in which a study's chunks of trials train; the result is the same, only the cost differs."""

    # Every chunk advances a check interval at a time, the one furthest behind first (engine.interleave).
    BREADTH_FIRST = "breadth_first"
    # Each chunk trains to its end before the next starts (the cost depends on finding the best early).
    DEPTH_FIRST = "depth_first"


# Probes a study may ask for (their code is in probes.py, which needs torch; the names do not).
PROBE_NAMES = ("lipschitz", "noise_scale")


class ProbeTrials(str, Enum):
    """Which trials of a study its probes measure. A probed trial trains its whole run (to its goal, the cap or
    divergence) whatever the early-stopping mode, as the original measures."""

    # The trials train (or are reused) without probes, then the best trains again with them: the same trajectory.
    BEST = "best"
    # Every trial probes, so every trial trains its whole run.
    ALL = "all"


# Far below 2**63: worker processes share the best step as a signed 64-bit integer.
MAX_STEP_CAP = 10**9
SEED_LIMIT = 2**32


def replicate_seeds(seed: int, replicates: int) -> range:
    """The study seeds of ``replicates`` replicates from ``seed`` (seed, seed + 1, ...): refused in one line when
    they would pass the largest seed."""
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 1:
        raise EdpsError(f"replicates must be a positive integer, got {replicates}")
    if seed + replicates > SEED_LIMIT:
        raise EdpsError(f"--seed {seed} with --replicates {replicates} passes the largest seed, {SEED_LIMIT - 1}")
    return range(seed, seed + replicates)


def parse_probes(text: str | None) -> tuple[str, ...]:
    """``lipschitz,noise_scale`` -> a sorted tuple of probe names (unknown names are an error)."""
    return _checked_probes(tuple(part.strip() for part in (text or "").split(",") if part.strip()))


def _checked_probes(names: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in PROBE_NAMES]
    if unknown:
        raise EdpsError(f"unknown probe {unknown[0]!r}; known probes: {', '.join(PROBE_NAMES)}")
    return tuple(sorted(set(names)))


def _check_goal(workload: Workload, goal: Any) -> None:
    problem = workload.goal_problem(goal)
    if problem is None:  # an error rate in (0, 1), or a positive loss (the workload's goal metric)
        return
    loss = workload.goal_words.endswith("loss")
    hint = f" ({workload.name} sets a {workload.goal_words} to reach)" if loss else \
        f" ({workload.name} sets a validation error rate, not a loss)" if isinstance(goal, (int, float)) \
        and not isinstance(goal, bool) and goal >= 1 else ""
    raise EdpsError(f"goal {workload.goal_words.split()[-1]} {problem}{hint}")


def _checked_ladder(workload: Workload, goals: Any, hardest: float) -> tuple[float, ...]:
    """A ladder as the study keeps it: its rungs checked (each a goal of the workload's metric, strictly
    harder than the one before, the last the study's goal), and a single rung folded into the plain study."""
    if not isinstance(goals, (tuple, list)):
        raise EdpsError(f"goals must be a list of numbers, got {goals!r}")
    for goal in goals:
        _check_goal(workload, goal)
    ladder = tuple(float(goal) for goal in goals)
    for easier, harder in zip(ladder, ladder[1:]):
        if harder == easier:
            raise EdpsError(f"goal {easier:g} is repeated in the ladder {goals_text(ladder)}")
        if harder > easier:
            raise EdpsError(f"goals must go from the easiest to the hardest (each smaller than the one before), got "
                            f"{goals_text(ladder)}")
    if ladder and ladder[-1] != hardest:
        raise EdpsError(f"the ladder's hardest goal ({ladder[-1]:g}) must be the study's goal ({hardest:g})")
    return ladder if len(ladder) > 1 else ()


def _check_count(name: str, value: int, low: int = 1, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
        raise EdpsError(f"{name} must be {kind}, got {value!r}")
    if high is not None and value > high:
        raise EdpsError(f"{name} must be at most {high:,}, got {value!r}")


@dataclass(frozen=True)
class StudySpec:
    """Everything that defines one study: (workload, optimizer, sparsity, batch size) and its search. Validated on
    construction: a StudySpec that exists is a valid one."""

    workload: str
    optimizer: str
    sparsity: float
    batch_size: int
    trials: int
    goal_error: float
    max_steps: int
    check_interval: int
    seed: int
    # Measurements during training (probes.py): a study asked for them must not reuse trials measured without
    # them, so they enter the keys when present.
    probes: tuple[str, ...] = ()
    probe_interval: int = 1000
    # Which trials the probes measure (only with probes); ``all`` stays out of the key, as before the choice.
    probe_trials: ProbeTrials = ProbeTrials.ALL
    # TF32 matmuls and convolutions on GPUs that have them (off: full FP32, as the original); keyed when on.
    allow_tf32: bool = False
    # sha256 of the data loaded (data/fingerprint.py), so that two copies of a dataset never share keys; studies
    # and sweeps always set it (a spec without it keys as runs did before fingerprints).
    data_fingerprint: str | None = None
    # The pruning method at initialisation (pruning/). Nothing is pruned at sparsity 0, whatever the method: the
    # dense study is spelled "snip" there, one study for every method's curve.
    pruning: str = DEFAULT_METHOD
    # A goal ladder (easiest first, ending at ``goal_error``): every rung is measured from the same trials. Empty
    # for a one-goal study, the only spelling of it, so that its key is the key it always had.
    goals: tuple[float, ...] = ()
    # What the search tunes: the optimizer's own metaparameters, or beta2 and a decoupled weight decay in
    # batch-invariant units (coordinates.py); keyed when invariant.
    search_coordinates: Coordinates = Coordinates.RAW
    # SP (the paper's) or SμPar (supar.py). At sparsity 0 every density is 1 and SμPar is SP to the bit: spelled
    # "sp" there, so that one dense study serves both.
    parameterization: Parameterization = Parameterization.SP

    def __post_init__(self) -> None:
        """Raise EdpsError with one clear sentence for the first bad value; normalise the rest."""
        workload = get_workload(self.workload)
        # A ``package.module:NAME`` reference keys as the workload's own name, as an entry point's does.
        object.__setattr__(self, "workload", workload.name)
        object.__setattr__(self, "optimizer", parse_optimizer(self.optimizer))
        _check_count("batch size", self.batch_size)
        if self.batch_size > workload.train_size:
            raise EdpsError(f"batch size {self.batch_size} exceeds the {workload.train_size} training examples of "
                            f"{workload.name}")
        if not isinstance(self.sparsity, (int, float)) or isinstance(self.sparsity, bool) \
                or not (0.0 <= self.sparsity < 1.0):
            raise EdpsError(f"sparsity must be in [0, 1), got {self.sparsity}")
        object.__setattr__(self, "goals", _checked_ladder(workload, self.goals, self.goal_error))
        _check_goal(workload, self.goal_error)
        _check_count("trials", self.trials, 1, 100_000)
        _check_count("check interval", self.check_interval, 1, MAX_STEP_CAP)
        _check_count("max steps", self.max_steps, 1, MAX_STEP_CAP)
        if self.max_steps < self.check_interval:
            raise EdpsError(f"max steps ({self.max_steps}) must be at least the check interval ({self.check_interval})")
        _check_count("seed", self.seed, 0, SEED_LIMIT - 1)
        _check_count("probe interval", self.probe_interval, 1, MAX_STEP_CAP)
        # -0.0 is 0.0: the same study must get the same key however the number was spelled.
        object.__setattr__(self, "sparsity", float(self.sparsity) + 0.0)
        object.__setattr__(self, "goal_error", float(self.goal_error))
        object.__setattr__(self, "probes", _checked_probes(tuple(self.probes)))
        try:
            object.__setattr__(self, "probe_trials", ProbeTrials(self.probe_trials))
        except ValueError:
            choices = " or ".join(k.value for k in ProbeTrials)
            raise EdpsError(f"unknown probe trials {self.probe_trials!r}; choose {choices}") from None
        if not self.probes:  # the choice means nothing without probes: one spelling of the plain study
            object.__setattr__(self, "probe_trials", ProbeTrials.ALL)
        object.__setattr__(self, "allow_tf32", bool(self.allow_tf32))
        pruning = parse_method(self.pruning)
        object.__setattr__(self, "pruning", DEFAULT_METHOD if self.sparsity == 0.0 else pruning)
        parameterization = parse_parameterization(self.parameterization)
        object.__setattr__(self, "parameterization", Parameterization.SP if self.sparsity == 0.0 else parameterization)
        if method_info(pruning).needs_continuous_inputs and workload.input_layout is InputLayout.TOKENS:
            raise EdpsError(f"{pruning} feeds the network an all-ones input; workload {workload.name} takes token "
                            f"ids: choose another pruning method")
        object.__setattr__(self, "search_coordinates", parse_coordinates(self.search_coordinates))
        self.search_space(workload)  # refused in one line: invariant coordinates where the optimizer has none
        if self.data_fingerprint is not None and not (
                isinstance(self.data_fingerprint, str) and len(self.data_fingerprint) == 64
                and all(c in "0123456789abcdef" for c in self.data_fingerprint)):
            raise EdpsError(f"data fingerprint must be 64 hex digits, got {self.data_fingerprint!r}")

    @property
    def ladder(self) -> tuple[float, ...]:
        """Every goal of the study, easiest first: ``goals``, or the one goal."""
        return self.goals or (self.goal_error,)

    def rung(self, goal: float) -> "StudySpec":
        """The one-goal study of one rung of the ladder: its key is what that rung answers."""
        return replace(self, goal_error=goal, goals=())

    @classmethod
    def build(cls, workload: str, optimizer: str, sparsity: float, batch_size: int,
              trials: int | None = None, goal_error: float | None = None, max_steps: int | None = None,
              check_interval: int | None = None, seed: int = 0, probes: tuple[str, ...] = (),
              probe_interval: int | None = None, allow_tf32: bool = False,
              probe_trials: ProbeTrials | str = ProbeTrials.BEST, pruning: str = DEFAULT_METHOD,
              **fields: Any) -> "StudySpec":
        """A study with the workload's protocol (trials, goal, cap, check and probe intervals) wherever a
        value is None; any other field as given (``fields``)."""
        item = get_workload(workload)
        goals = tuple(fields.pop("goals", None) or ())
        if goals:
            # A ladder's hardest goal is the study's goal: naming it twice is fine, naming another is a mistake.
            if goal_error is not None and goal_error != goals[-1]:
                raise EdpsError(f"the goal error ({goal_error:g}) is not the ladder's hardest goal ({goals[-1]:g}): "
                                f"give --goals alone")
            goal_error = goals[-1]
        fields["goals"] = goals
        return cls(workload, optimizer, sparsity, batch_size, trials if trials is not None else item.default_trials,
                   goal_error if goal_error is not None else item.goal_error,
                   max_steps if max_steps is not None else item.max_steps,
                   check_interval if check_interval is not None else item.check_interval, seed, probes,
                   probe_interval if probe_interval is not None else item.probe_interval,
                   allow_tf32=allow_tf32, probe_trials=probe_trials, pruning=pruning, **fields)

    def search_space(self, workload: Workload) -> SearchSpace:
        """What the study tunes, in its search coordinates."""
        return workload.search_space(self.optimizer, self.search_coordinates, self.batch_size)

    def key_fields(self) -> dict[str, Any]:
        """The fields hashed into the keys (fields.STUDY_FIELDS; those at their key default are left out)."""
        return key_fields(self)

    @property
    def study_key(self) -> str:
        return content_key({"kind": "study", **self.key_fields()})

    @property
    def trains_whole_runs(self) -> bool:
        """Every trial probes, so none is cut short by exact early stopping."""
        return bool(self.probes) and self.probe_trials is ProbeTrials.ALL

    def full_trials(self, requested: bool) -> bool:
        """Whether this study trains every trial to its own end: when asked, or when every trial probes."""
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


@dataclass(frozen=True)
class TrialSpec:
    """One point of the search with its seed, inside a study."""

    study: StudySpec
    index: int
    metaparameters: dict[str, float] = field(hash=False)

    @property
    def init_seed(self) -> int:
        """Its own initialisation seed (hence its own mask, and pruning scores shared across the grid)."""
        return int(np.random.SeedSequence([self.study.seed, self.index]).generate_state(1)[0])

    @property
    def optimizer(self) -> "TrialOptimizer":
        """Its optimizer: settings and schedule from its metaparameters."""
        return get_optimizer(self.study.optimizer).trial(self.metaparameters)

    @property
    def trial_key(self) -> str:
        # Not the trial count: a study with more trials reuses the trials of a smaller one with the same settings.
        study_fields = {k: v for k, v in self.study.key_fields().items() if k != "trials"}
        return content_key({"kind": "trial", **study_fields, "init_seed": self.init_seed,
                            "metaparameters": {k: float(v) for k, v in sorted(self.metaparameters.items())}})


# The version of what a key's result means, hashed into every key: bumped only when a spec that keeps its key
# would get a different result (tests/test_results_version.py says when), which re-keys (retrains) the whole store.
# A release leaves it alone; it equals the package version keys hashed before it existed.
RESULTS_VERSION = "0.1.0"


def content_key(fields: dict[str, Any]) -> str:
    # "version", as when it held the package version: the same keys.
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
