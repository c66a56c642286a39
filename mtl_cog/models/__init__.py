"""Models: timm backbones, batched task heads, calibrators, the network and its two-stage variant."""
