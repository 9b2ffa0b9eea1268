"""Random pruning with Erdos-Renyi-Kernel densities (Evci et al. 2020): a tensor keeps a fraction proportional to
the sum of its dimensions over their product, scaled so that the prunable tensors keep (1 - sparsity) together,
a tensor whose density would exceed 1 kept whole (google-research/rigl's ``get_sparsities_erdos_renyi``). Each
tensor keeps round(n density) entries, drawn as ``random`` draws them. Biases are kept.
"""

from __future__ import annotations

import math

from edps_mlflow.pruning.base import Shapes
from edps_mlflow.pruning.random_layerwise import RandomLayerwise


def erk_densities(shapes: Shapes, density: float) -> dict[str, float]:
    """Each tensor's density under ERK at an overall ``density`` of these tensors (rigl's procedure, exact
    arithmetic instead of its floor of each tensor's zeros)."""
    sizes = {name: math.prod(shape) for name, shape in shapes.items()}
    raw = {name: sum(shape) / sizes[name] for name, shape in shapes.items()}
    dense: set[str] = set()
    while True:
        # scale * sum(raw_i n_i) over the scaled tensors = the kept entries left for them
        # = density * (every entry) - (entries of the tensors kept whole).
        budget = density * sum(sizes.values()) - sum(sizes[name] for name in dense)
        divisor = sum(raw[name] * sizes[name] for name in shapes if name not in dense)
        scale = budget / divisor
        largest = max(raw[name] for name in shapes if name not in dense)
        if scale * largest <= 1.0:
            break
        dense.update(name for name in shapes if name not in dense and raw[name] == largest)
    return {name: 1.0 if name in dense else scale * raw[name] for name in shapes}


class RandomErk(RandomLayerwise):
    def counts(self, shapes: Shapes, sparsity: float) -> dict[str, int]:
        """What each prunable tensor keeps: round(n density), its ERK density."""
        names = self.prunable(shapes)
        densities = erk_densities({name: shapes[name] for name in names}, 1.0 - sparsity)
        return {name: int(round(math.prod(shapes[name]) * densities[name])) for name in names}
