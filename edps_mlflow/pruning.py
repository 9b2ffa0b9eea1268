"""SNIP at initialisation (Lee et al. 2019) as in the paper, and the mask file format.

1. A multiplicative mask c = 1 on every weight *and bias* tensor.
2. One pass over the training split in batches of 100, summing the signed dL/dc of the batch-mean
   loss (the workload's training loss). Since the loss sees w * c, dL/dc at c = 1 is w * dL/dw, so
   the sum is w * (sum of grads).
3. Sensitivity |sum|, normalised to sum 1 (which does not change the ranking).
4. Keep the global top-k, k = round(N (1 - sparsity)).

Biases start at zero, so their sensitivity is zero and any real sparsity prunes every bias, as the
original does; the mask summary shows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from edps_mlflow.workloads import Loss

SNIP_BATCH_SIZE = 100


@dataclass(frozen=True)
class Mask:
    """name -> {0, 1} float tensor, same shapes as the network's parameters."""

    tensors: dict[str, Tensor]

    @property
    def total(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    @property
    def kept(self) -> int:
        return int(sum(int(t.sum().item()) for t in self.tensors.values()))

    @property
    def is_dense(self) -> bool:
        return self.kept == self.total

    def summary(self) -> dict:
        layers = {
            name: {"kept": int(t.sum().item()), "total": t.numel(), "kept_fraction": float(t.mean().item())}
            for name, t in self.tensors.items()
        }
        return {"kept": self.kept, "total": self.total, "kept_fraction": self.kept / self.total,
                "sparsity": 1.0 - self.kept / self.total, "layers": layers}

    def save(self, directory: Path, mask_name: str, summary_name: str) -> tuple[Path, Path]:
        """Write the mask (``.npz`` of boolean arrays, loads with allow_pickle=False) and its JSON summary."""
        directory.mkdir(parents=True, exist_ok=True)
        mask_path, summary_path = directory / mask_name, directory / summary_name
        np.savez_compressed(mask_path, **{name: t.cpu().numpy().astype(bool) for name, t in self.tensors.items()})
        summary_path.write_text(json.dumps(self.summary(), indent=2))
        return mask_path, summary_path

    @classmethod
    def load(cls, path: Path) -> "Mask":
        with np.load(path, allow_pickle=False) as arrays:
            return cls({name: torch.from_numpy(arrays[name].astype(np.float32)) for name in arrays.files})


def dense_mask(model: nn.Module) -> Mask:
    return Mask({name: torch.ones_like(p, device="cpu") for name, p in model.named_parameters()})


def snip_scores(model: nn.Module, images: Tensor, labels: Tensor, loss: Loss,
                batch_size: int = SNIP_BATCH_SIZE) -> dict[str, Tensor]:
    """|sum over batches of dL/dc| for every parameter (un-normalised), L the mean ``loss`` of a batch."""
    params = dict(model.named_parameters())
    gradient_sums = {name: torch.zeros_like(p) for name, p in params.items()}
    for start in range(0, labels.shape[0], batch_size):
        model.zero_grad(set_to_none=True)
        loss(model(images[start:start + batch_size]), labels[start:start + batch_size]).backward()
        for name, p in params.items():
            gradient_sums[name] += p.grad
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        return {name: (params[name] * gradient_sums[name]).abs() for name in params}


def snip_mask(model: nn.Module, images: Tensor, labels: Tensor, sparsity: float, loss: Loss) -> Mask:
    """Global top-k of the normalised SNIP sensitivities of ``loss``; exactly k = round(N (1 - sparsity)) kept."""
    if sparsity == 0.0:
        return dense_mask(model)
    scores = snip_scores(model, images, labels, loss)
    names = list(scores)
    flat = torch.cat([scores[name].flatten() for name in names])
    total = flat.sum()
    if total > 0:
        flat = flat / total
    keep = int(round(flat.numel() * (1.0 - sparsity)))
    selected = torch.zeros_like(flat)
    selected[torch.topk(flat, keep, sorted=False).indices] = 1.0
    tensors, offset = {}, 0
    for name in names:
        size = scores[name].numel()
        tensors[name] = selected[offset:offset + size].reshape(scores[name].shape).cpu()
        offset += size
    return Mask(tensors)
