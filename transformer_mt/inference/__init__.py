"""What uses a trained model: load a checkpoint, translate lines, draw attention pictures.

Never imports :mod:`transformer_mt.training`: translating needs no optimizer, data pipeline or
process group. Future parts (an HTTP server, exporters) belong here too.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_mt.inference.loading import LoadedModel, load_for_inference
    from transformer_mt.inference.translate import format_best, format_nbest, translate_lines

__all__ = ["LoadedModel", "format_best", "format_nbest", "load_for_inference", "translate_lines"]

# Where each export lives: imported when first read, so that the torch-free modules (the
# server's settings, read by the command line's options) load without torch.
_EXPORTS = {"LoadedModel": "loading", "load_for_inference": "loading"} | dict.fromkeys(
    ("format_best", "format_nbest", "translate_lines"), "translate"
)


def __getattr__(name: str) -> Any:
    """An export of the package, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
