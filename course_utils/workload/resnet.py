"""ResNet-50 by hand, at its real size: the model of PyTorch's own DDP benchmark.

He et al., "Deep Residual Learning for Image Recognition" (2015), in the layout of torchvision's
``resnet50`` (the stride-2 convolution of each stage's first block is its 3x3 one, "ResNet v1.5"):

    image [B, 3, 224, 224]
      -> conv 7x7/2 (64), batch norm, ReLU, max pool 3x3/2           [B, 64, 56, 56]
      -> 4 stages of bottleneck blocks: 3, 4, 6 and 3 blocks,
         widths 64, 128, 256, 512, each block 1x1 -> 3x3 -> 1x1 (x4 wide),
         the stages after the first halving the image                 [B, 2048, 7, 7]
      -> global average pool, fully connected 2048 -> 1000            logits [B, 1000]

25,557,032 parameters (torchvision's count for ``resnet50``), 102 MB of float32 gradients.
torchvision is not a course dependency; this copy holds the same layers, so that a cluster
model of the benchmark can build it, usually on the ``meta`` device (shapes, no numbers).

Taught in chapter 04 (appendix 04b, section 5: PyTorch's DDP benchmark, modeled).
"""

from __future__ import annotations

from torch import nn

__all__ = ["Bottleneck", "resnet50", "RESNET50_PARAMETERS"]

RESNET50_PARAMETERS = 25_557_032  #: torchvision's count for resnet50


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    """``x [B, cin, H, W] -> [B, 4 width, H / stride, W / stride]``: 1x1, 3x3 (stride), 1x1 convolutions
    with batch norms, added to the input (or to its 1x1 projection when the shape changes)."""

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            *_conv_bn(cin, width, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(width, width, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(width, cout, 1),
        )
        self.shortcut = (
            nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-50 (module docstring): ``images [B, 3, 224, 224] -> logits [B, num_classes]``.
    Build it under ``with torch.device("meta"):`` for its shapes alone."""
    layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for block in range(blocks):
            layers.append(Bottleneck(cin, width, stride=2 if stage > 0 and block == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)
