"""What a sweep is (``SweepSpec``, its grid) and how it runs (``SweepOptions``), validated on construction.
No torch, no MLflow: `edps sweep` refuses a bad value before the sweep's machinery (sweep.py) is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from edps_mlflow.config import StudySpec, content_key, replicate_seeds
from edps_mlflow.coordinates import Coordinates
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import check_executor_name
from edps_mlflow.fields import GRID_AXES
from edps_mlflow.mlproject import ProjectLaunch
from edps_mlflow.names import goals_text
from edps_mlflow.optimizers import parse_optimizer
from edps_mlflow.parameterization import Parameterization, parse_parameterization
from edps_mlflow.pruning import DEFAULT_METHOD, parse_method
from edps_mlflow.resources import check_device_name
from edps_mlflow.workloads import get_workload


@dataclass(frozen=True)
class SweepSpec:
    """Optimizers x sparsities x pruning methods x batch sizes of one study protocol: every study of the grid is
    ``protocol`` at one grid point. Sparsity 0 prunes nothing: one dense study whatever the methods."""

    protocol: StudySpec
    optimizers: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    sparsities: tuple[float, ...]
    prunings: tuple[str, ...] = (DEFAULT_METHOD,)
    # Independent studies per grid point: seeds protocol.seed, protocol.seed + 1, ... (the same search points).
    replicates: int = 1
    parameterizations: tuple[Parameterization, ...] = (Parameterization.SP,)

    def __post_init__(self) -> None:
        replicate_seeds(self.protocol.seed, self.replicates)  # refused in one line past the largest seed
        object.__setattr__(self, "prunings", tuple(parse_method(m) for m in self.prunings))
        object.__setattr__(self, "parameterizations", tuple(parse_parameterization(p) for p in self.parameterizations))
        for name, values in (("optimizers", self.optimizers), ("batch sizes", self.batch_sizes),
                             ("sparsities", self.sparsities), ("pruning methods", self.prunings),
                             ("parameterizations", self.parameterizations)):
            if not values:
                raise EdpsError(f"a sweep needs at least one value of {name}")
            if len(set(values)) != len(values):
                raise EdpsError(f"{name} repeat a value: {', '.join(str(v) for v in values)}")
        object.__setattr__(self, "optimizers", tuple(parse_optimizer(o) for o in self.optimizers))
        # Constructing the studies validates every value; their normalised sparsities (-0.0 is 0.0) are kept.
        object.__setattr__(self, "sparsities", tuple(dict.fromkeys(s.sparsity for s in self.studies())))

    @classmethod
    def build(cls, workload: str, optimizers: tuple[str, ...], batch_sizes: tuple[int, ...] | None = None,
              sparsities: tuple[float, ...] | None = (0.0,), *protocol: Any,
              prunings: tuple[str, ...] = (DEFAULT_METHOD,), replicates: int = 1,
              parameterizations: tuple[str, ...] = (Parameterization.SP,), **named: Any) -> "SweepSpec":
        """A sweep of one study protocol: ``protocol`` and ``named`` are StudySpec.build's arguments after the
        batch size (the workload's value wherever one is None). Batch sizes default to the powers of two from 2
        to the largest that fits the training split, sparsities to 0."""
        if batch_sizes is None:
            batch_sizes = get_workload(workload).batch_size_range()
        first = optimizers[0] if optimizers else "sgd"
        study = StudySpec.build(workload, first, 0.0, batch_sizes[0] if batch_sizes else 1, *protocol, **named)
        return cls(study, tuple(parse_optimizer(o) for o in optimizers), batch_sizes,
                   (0.0,) if sparsities is None else sparsities, prunings, replicates, tuple(parameterizations))

    @property
    def workload(self) -> str:
        return self.protocol.workload

    def studies(self) -> list[StudySpec]:
        """Every study of the grid once (the dense study once, whatever the methods); replicate by replicate, so
        that the first replicate of every point comes first."""
        return list(dict.fromkeys(
            replace(self.protocol, optimizer=optimizer, sparsity=sparsity, pruning=pruning, batch_size=batch_size,
                    seed=seed, parameterization=parameterization)
            for seed in self.seeds for optimizer in self.optimizers for sparsity in self.sparsities
            for pruning in self.prunings for parameterization in self.parameterizations
            for batch_size in self.batch_sizes))

    @property
    def seeds(self) -> range:
        """The study seeds of the replicates."""
        return replicate_seeds(self.protocol.seed, self.replicates)

    @property
    def sweep_key(self) -> str:
        # The protocol's key fields but for the grid's axes, which the protocol holds only as placeholders.
        protocol = {k: v for k, v in self.protocol.key_fields().items() if k not in GRID_AXES}
        # SNIP alone is every sweep's grid before methods existed: those sweeps keep their keys.
        methods = {} if self.prunings == (DEFAULT_METHOD,) else {"prunings": list(self.prunings)}
        replicates = {} if self.replicates == 1 else {"replicates": self.replicates}  # one: every older sweep
        parameterizations = {} if self.parameterizations == (Parameterization.SP,) else {
            "parameterizations": [p.value for p in self.parameterizations]}
        return content_key({
            "kind": "sweep", "optimizers": list(self.optimizers), "batch_sizes": list(self.batch_sizes),
            "sparsities": list(self.sparsities), **methods, **replicates, **parameterizations, **protocol})

    def params(self) -> dict[str, Any]:
        """The sweep run's params."""
        p = self.protocol
        return {"workload": self.workload, "optimizers": ",".join(self.optimizers),
                "batch_sizes": ",".join(map(str, self.batch_sizes)),
                "sparsities": ",".join(f"{s:g}" for s in self.sparsities), "pruning": ",".join(self.prunings),
                "trials": p.trials, "goal_error": p.goal_error, "max_steps": p.max_steps,
                "check_interval": p.check_interval, "seed": p.seed, "probes": ",".join(p.probes),
                "probe_interval": p.probe_interval, "probe_trials": p.probe_trials.value if p.probes else "",
                "allow_tf32": p.allow_tf32, **({"goals": goals_text(p.goals)} if p.goals else {}),
                **({"replicates": self.replicates} if self.replicates > 1 else {}),
                **({"search_coordinates": p.search_coordinates.value}
                   if p.search_coordinates is not Coordinates.RAW else {}),
                **({"parameterization": ",".join(form.value for form in self.parameterizations)}
                   if self.parameterizations != (Parameterization.SP,) else {}),
                **({"data_fingerprint": p.data_fingerprint} if p.data_fingerprint else {})}


@dataclass(frozen=True)
class SweepOptions:
    experiment: str | None = None
    executor: str = "local"
    workers: int | None = None
    ray_address: str | None = None
    device: str | None = None
    data_dir: str | None = None
    full_trials: bool = False
    log_interval: float = 30.0  # seconds between progress lines in a log (a terminal updates in place)
    wait: bool = False  # a live run of this sweep elsewhere: wait for it instead of stopping
    accept_unverified_data: bool = False  # data files that are not the published ones (catalog.require_verified)
    project: ProjectLaunch = field(default_factory=ProjectLaunch)  # where --executor mlflow-project submits

    def __post_init__(self) -> None:
        check_executor_name(self.executor)
        if self.executor != "mlflow-project" and self.project != ProjectLaunch():
            raise EdpsError("--backend, --backend-config and --env-manager are options of --executor mlflow-project")
        if self.workers is not None and (isinstance(self.workers, bool) or self.workers < 1):
            raise EdpsError(f"workers must be a positive integer, got {self.workers}")
        check_device_name(self.device, indexed=False)
