"""tensorboardX, imported without torch.

tensorboardX's writer module imports torch at import time when torch is installed, only so that it can accept torch
tensors. We log Python floats. Where torch is installed but not imported (the tests' reference, a Colab runtime),
that import costs ~3 CPU-seconds in every process that writes or reads a TensorBoard event file: every training
stage run as its own process. `tensorboardx()` imports the package with torch hidden, so its optional import falls
back as it does where torch is absent; a process that has imported torch already gets the package as it is.
"""
from __future__ import annotations

import importlib
import sys
import types


def tensorboardx() -> types.ModuleType:
    """Returns the tensorboardX package, importing it (the first time) without importing torch."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return importlib.import_module("tensorboardX")
    sys.modules["torch"] = None  # `import torch` raises ImportError, as where torch is not installed
    try:
        return importlib.import_module("tensorboardX")
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
