"""The mask every pruning method produces, and its file format (no pickle)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn


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
