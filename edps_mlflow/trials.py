"""Turning a TrialSpec into what the engine trains: seeded initialisation and the SNIP mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from edps_mlflow.config import OptimizerSettings, TrialSpec
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.pruning import Mask, snip_mask
from edps_mlflow.workloads import Workload


@dataclass(frozen=True)
class TrialSetup:
    """What the engine needs for one trial: masked initial parameters, the mask, the optimizer."""

    index: int
    initial_parameters: dict[str, Tensor]
    mask: Mask
    optimizer: OptimizerSettings


def prepare_trial(workload: Workload, data: DataSplits, trial: TrialSpec) -> TrialSetup:
    """Initialise with the trial's own seed (the workload's initialisation), prune at initialisation, and mask
    the initial weights.

    ``data`` may be on any device; SNIP runs where the data are.
    """
    model = workload.build_model()
    workload.initialise(model, torch.Generator().manual_seed(trial.init_seed))
    model.to(data.train_images.device)
    mask = snip_mask(model, data.train_images, data.train_labels, trial.study.sparsity, workload.loss)
    with torch.no_grad():
        initial = {name: (p.detach() * mask.tensors[name].to(p.device)).cpu()
                   for name, p in model.named_parameters()}
    return TrialSetup(index=trial.index, initial_parameters=initial, mask=mask, optimizer=trial.optimizer)
