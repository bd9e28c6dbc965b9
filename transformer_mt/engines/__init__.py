"""The engine floor: what runs a trained model, for every front door.

A library user needs one call: ``load_engine(kind, path).translate(lines, decode)`` gives, per
line, a :class:`LineResult` (best text, score, n-best, and what :class:`TranslateExtras` asked
for: word alignments, pictures, sentence splitting, glossary terms). Both are exported here.

An :class:`~transformer_mt.engines.engine.Engine` (our Transformer, or a CTranslate2 export) takes
lines and gives each its n-best translations (and, where asked, attention); ``load_engine`` makes
one from a checkpoint or an export directory (``engine``: the interface a caller reads, defined in
``base``; the engines in ``torch_engine`` and ``ct2_engine``). Beside it: the model options and
extras (``options``) and the results (``results``), both torch-free; loading a checkpoint for
inference (``loading``), the int8/bf16/packed linear layers it swaps in (``linear_layers``),
attention matrices, pictures and word alignments (``attention``), lines -> n-best with output
formats (``lines``), and the CTranslate2 runtime with the settings file it reads (``ct2``).
``load_for_inference`` and ``translate_lines`` are exported too, for what needs the model itself
(`mt export`, benchmarks, tests of the search).

Never imports :mod:`transformer_mt.training`, :mod:`transformer_mt.serve`,
:mod:`transformer_mt.documents` or :mod:`transformer_mt.convert`: translating needs no optimizer,
data pipeline, process group, HTTP or file format.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_mt.engines.base import Engine
    from transformer_mt.engines.engine import load_engine
    from transformer_mt.engines.lines import format_best, format_nbest, translate_lines
    from transformer_mt.engines.loading import LoadedModel, load_for_inference
    from transformer_mt.engines.options import ModelOptions, TranslateExtras
    from transformer_mt.engines.results import LineResult

__all__ = [
    "Engine",
    "LineResult",
    "LoadedModel",
    "ModelOptions",
    "TranslateExtras",
    "format_best",
    "format_nbest",
    "load_engine",
    "load_for_inference",
    "translate_lines",
]

# Where each export lives: imported when first read, so that the torch-free modules (the
# result types, the model options read by the command line) load without torch.
_EXPORTS = {
    "Engine": "base",
    "LineResult": "results",
    "LoadedModel": "loading",
    "ModelOptions": "options",
    "TranslateExtras": "options",
    "format_best": "lines",
    "format_nbest": "lines",
    "load_engine": "engine",
    "load_for_inference": "loading",
    "translate_lines": "lines",
}


def __getattr__(name: str) -> Any:
    """An export of the package, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
