"""EAGLE-3 draft heads: the module, its file formats, and the trainer (`python -m batchspec.train_draft`)."""

from .config import EagleConfig, HeadError, default_layer_ids
from .head import EagleHead

__all__ = ["EagleConfig", "EagleHead", "HeadError", "default_layer_ids"]
