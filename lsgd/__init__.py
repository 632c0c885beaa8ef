"""lsgd: an experiment harness for communication-efficient distributed training in PyTorch."""

__version__ = "0.1.0"
