"""EAGLE-3 draft heads: the module (head.py, config.py) and its file formats (formats.py, weights.py,
layer_ids.py). Training them is batchspec/training/ (`batchspec train-draft`)."""

from .config import EagleConfig, HeadError, default_layer_ids
from .head import EagleHead

__all__ = ["EagleConfig", "EagleHead", "HeadError", "default_layer_ids"]
