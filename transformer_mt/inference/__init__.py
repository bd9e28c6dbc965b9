"""What uses a trained model: load a checkpoint, translate lines, draw attention pictures.

Never imports :mod:`transformer_mt.training`: translating needs no optimizer, data pipeline or
process group. Future parts (an HTTP server, exporters) belong here too.
"""

from transformer_mt.inference.loading import LoadedModel, load_for_inference
from transformer_mt.inference.translate import format_best, format_nbest, translate_lines

__all__ = ["LoadedModel", "format_best", "format_nbest", "load_for_inference", "translate_lines"]
