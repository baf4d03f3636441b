"""corral: a GPU cluster manager for deep-learning training."""

__version__ = "0.1.0"
