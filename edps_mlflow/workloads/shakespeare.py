"""A character-level language model on Tiny Shakespeare: a loss goal (nats per character) on token inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edps_mlflow.search import WEIGHT_DECAY, Dimension, Scale, SearchSpace
from edps_mlflow.workloads.contract import GoalMetric, InputLayout, Workload
from edps_mlflow.workloads.paper import catalog_data

if TYPE_CHECKING:
    import torch
    from torch import nn

# Adam's learning rate centred on 3e-3 (the first Sobol point); no warm-up, which would add the same steps at every
# batch size. The other optimizers keep their default spaces.
LM_LEARNING_RATE = Dimension("learning_rate", 1e-4, 0.1, Scale.LOG)


def _char_transformer() -> "nn.Module":
    from edps_mlflow.data.shakespeare import ALPHABET, CONTEXT
    from edps_mlflow.models.char_transformer import CharTransformer

    return CharTransformer(vocabulary=len(ALPHABET), context=CONTEXT, width=32, depth=2, heads=4)


def _init_char_transformer(model: "nn.Module", generator: "torch.Generator") -> None:
    from edps_mlflow.models.char_transformer import init_char_transformer

    init_char_transformer(model, generator)


# Small enough that a study runs on a CPU (docs/workloads.md has the measurements behind these choices). The goal
# is the validation cross-entropy in nats per character (on the first 1,024 windows of the last 10% of the text,
# data/shakespeare.py); the sizes are those of the real file's windows of 32 characters.
SHAKESPEARE = Workload(
    name="shakespeare-char-transformer",
    description="Tiny Shakespeare, characters (31,370 / 1,024 windows of 32), a decoder-only transformer "
                "(width 32, 2 blocks, 4 heads; 30,721 parameters); goal: validation loss, nats per character",
    load_data=catalog_data("tiny-shakespeare"),
    build_model=_char_transformer,
    goal_error=2.2,
    max_steps=3000,
    search_spaces={"adam": SearchSpace((LM_LEARNING_RATE,)), "adamw": SearchSpace((LM_LEARNING_RATE, WEIGHT_DECAY))},
    needs_data_dir=True,
    dataset="tiny-shakespeare",
    train_size=31_370,
    validation_size=1_024,
    input_layout=InputLayout.TOKENS,
    default_trials=8,
    check_interval=25,
    probe_interval=25,
    goal_metric=GoalMetric.LOSS,
    initialise=_init_char_transformer,
)
