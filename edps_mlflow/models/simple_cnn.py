"""Simple-CNN of Lee et al. (62,346 parameters on 28x28x1) and a small variant for 8x8 digits: two 5x5
convolutions (32, 64 channels, no padding) each with ReLU and 2x2 max-pooling, then one linear layer.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F


class SimpleCNN(nn.Module):
    def __init__(self, in_channels: int = 1, image_size: int = 28, channels: tuple[int, int] = (32, 64),
                 kernel_size: int = 5, padding: int = 0, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels[0], kernel_size, padding=padding)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel_size, padding=padding)
        side = (image_size - kernel_size + 1 + 2 * padding) // 2
        side = (side - kernel_size + 1 + 2 * padding) // 2
        if side < 1:
            raise ValueError(f"image size {image_size} is too small for this network")
        self.fc = nn.Linear(side * side * channels[1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        # reshape, not flatten(1): a channels-last activation is not contiguous in NCHW order.
        return self.fc(x.reshape(x.shape[0], -1))
