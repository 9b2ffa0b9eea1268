"""Turning a TrialSpec into what the engine trains: seeded initialisation and the mask of the study's pruning
method (pruning/), its scores computed or found in the score cache."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from edps_mlflow.config import TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.optimizers.base import TrialOptimizer
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.pruning.base import ScoreContext
from edps_mlflow.pruning.cache import ScoreCache
from edps_mlflow.pruning.mask import Mask
from edps_mlflow.pruning.prune import prune_at_initialisation
from edps_mlflow.results import PruningRecord
from edps_mlflow.supar import learning_rate_scales, rescale_initial, weight_densities
from edps_mlflow.workloads import Workload


@dataclass(frozen=True)
class TrialSetup:
    """What the engine needs for one trial: masked initial parameters, the mask, the optimizer (and how the
    mask was made); under SμPar, each scaled weight's learning-rate multiplier (none under SP)."""

    index: int
    initial_parameters: dict[str, Tensor]
    mask: Mask
    optimizer: TrialOptimizer
    pruning: PruningRecord | None = None
    learning_rate_scales: dict[str, float] = field(default_factory=dict)


def prepare_trial(workload: Workload, data: DataSplits, trial: TrialSpec,
                  score_cache: ScoreCache | None = None) -> TrialSetup:
    """Initialise with the trial's own seed, prune at initialisation, and mask the initial weights. The scores
    are computed where ``data`` are; with ``score_cache`` (and the data's fingerprint) costly ones once per
    initialisation. Under SμPar the scores are the SP initialisation's: the mask (hence each density) is the sp
    trial's of the same seed, and only then are the kept weights rescaled by their densities."""
    model = workload.build_model()
    workload.initialise(model, torch.Generator().manual_seed(trial.init_seed))
    model.to(data.train_images.device)
    context = ScoreContext(model, data, workload, trial.init_seed, trial.study.sparsity)
    mask, pruning = prune_at_initialisation(trial.study.pruning, context, trial.study.data_fingerprint, score_cache)
    with torch.no_grad():
        initial = {name: (p.detach() * mask.tensors[name].to(p.device)).cpu()
                   for name, p in model.named_parameters()}
    scales: dict[str, float] = {}
    if trial.study.parameterization is Parameterization.SUPAR:
        scales = learning_rate_scales(weight_densities(model, mask))
        rescale_initial(initial, scales)
    return TrialSetup(index=trial.index, initial_parameters=initial, mask=mask, optimizer=trial.optimizer,
                      pruning=pruning, learning_rate_scales=scales)
