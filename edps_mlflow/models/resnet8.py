"""ResNet-8 without batch norm (75,050 parameters on 32x32x3), as in the original code: a 3x3 convolution, three
pre-activation residual blocks of widths 16, 32, 64 and strides 1, 2, 2, global average pooling, a linear layer.
A down-sampling block's shortcut is 2x2 average pooling of its activated input with zero channels appended, and
its convolution pads as TensorFlow's SAME does (one row and column after, none before).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class _Block(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra_channels = out_channels - in_channels
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1 if stride == 1 else 0)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        activated = F.relu(x)
        if self.stride == 1 and self.extra_channels == 0:
            shortcut = x
        else:
            shortcut = F.avg_pool2d(activated, self.stride, self.stride)
            shortcut = torch.cat([shortcut, shortcut.new_zeros(
                (shortcut.shape[0], self.extra_channels) + tuple(shortcut.shape[2:]))], dim=1)
        if self.stride == 1:
            out = self.conv1(activated)
        else:
            # SAME padding for k=3, s=2 on an even size: total padding 1, all of it after.
            out = self.conv1(F.pad(activated, (0, 1, 0, 1)))
        return self.conv2(F.relu(out)) + shortcut


class ResNet8(nn.Module):
    def __init__(self, in_channels: int = 3, widths: tuple[int, int, int] = (16, 32, 64), num_classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, widths[0], 3, padding=1)
        self.block1 = _Block(widths[0], widths[0], 1)
        self.block2 = _Block(widths[0], widths[1], 2)
        self.block3 = _Block(widths[1], widths[2], 2)
        self.fc = nn.Linear(widths[2], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block3(self.block2(self.block1(self.conv(x))))
        return self.fc(F.relu(x).mean(dim=(2, 3)))
