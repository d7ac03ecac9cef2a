"""k26ops: run a TP8 DDTree SGLang engine on GPU hosts over SSH."""

__version__ = "0.1.0"
