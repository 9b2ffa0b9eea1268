"""Random pruning with Erdos-Renyi-Kernel densities (Evci et al. 2020, "Rigging the lottery"): a tensor of
shape (n_out, n_in, k_h, k_w) keeps a fraction proportional to (n_out + n_in + k_h + k_w) / (n_out n_in k_h k_w)
(a linear layer's (n_out + n_in) / (n_out n_in)), scaled so that the prunable tensors keep (1 - sparsity)
of their entries together; a tensor whose density would exceed 1 is kept whole and the scale found again for
the others, as google-research/rigl's ``sparse_utils.get_sparsities_erdos_renyi`` (include_kernel=True,
erk_power_scale=1) does. Each tensor then keeps round(n density) entries, uniformly at random from the
same stream as ``random`` (so the total can differ from round(N (1 - sparsity)) by the rounding of each
tensor). Biases are kept.
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
