"""Turning a TrialSpec into what the engine trains: seeded initialisation and the mask of the study's pruning
method (pruning/), its scores computed or found in the score cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from edps_mlflow.config import TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.optimizers.base import TrialOptimizer
from edps_mlflow.pruning.base import ScoreContext
from edps_mlflow.pruning.cache import ScoreCache
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.pruning.prune import prune_at_initialisation
from edps_mlflow.results import PruningRecord
from edps_mlflow.workloads import Workload


@dataclass(frozen=True)
class TrialSetup:
    """What the engine needs for one trial: masked initial parameters, the mask, the optimizer (and how the
    mask was made)."""

    index: int
    initial_parameters: dict[str, Tensor]
    mask: Mask
    optimizer: TrialOptimizer
    pruning: PruningRecord | None = None


def prepare_trial(workload: Workload, data: DataSplits, trial: TrialSpec,
                  score_cache: ScoreCache | None = None) -> TrialSetup:
    """Initialise with the trial's own seed, prune at initialisation, and mask the initial weights. The scores
    are computed where ``data`` are; with ``score_cache`` (and the data's fingerprint) costly ones once per
    initialisation."""
    model = workload.build_model()
    workload.initialise(model, torch.Generator().manual_seed(trial.init_seed))
    model.to(data.train_images.device)
    context = ScoreContext(model, data, workload, trial.init_seed, trial.study.sparsity)
    mask, pruning = prune_at_initialisation(trial.study.pruning, context, trial.study.data_fingerprint, score_cache)
    with torch.no_grad():
        initial = {name: (p.detach() * mask.tensors[name].to(p.device)).cpu()
                   for name, p in model.named_parameters()}
    return TrialSetup(index=trial.index, initial_parameters=initial, mask=mask, optimizer=trial.optimizer,
                      pruning=pruning)
