"""Engines: one interface over the ways a trained model can translate.

Our PyTorch model (one checkpoint or an ensemble), or a CTranslate2 export. Every front door
translates through it: `mt translate`, `mt evaluate`, documents and the server, and a Python user
with two calls::

    engine = load_engine("torch", "runs/toy/best.pt")
    results = engine.translate(["a line", "another"], engine.run_decode)

``engine.translate(lines, decode, attention)`` keeps the line contract of ``mt translate`` (one
result per line, in order, empty in -> empty out, a line with nothing to translate -- emoji,
numbers, a link alone -- out unchanged without decoding) and returns, per line, the best text and
score, the n-best list and, when asked, the cross-attention matrix with the pieces on both of its
axes. Given ``stop`` (a function of no arguments), it asks it after each decode batch and, when it
says True with lines still to decode, gives up with :class:`DecodeStopped`: the server's way of not
decoding the rest of a request whose client has gone.

Here: the interface (:class:`Engine`, defined in :mod:`~transformer_mt.engines.base` so that the
engines can subclass it without a circle through this module) and the factory, :func:`load_engine`
(:func:`check_engine`: its checks that load nothing). The engines: :class:`TorchEngine`
(:mod:`~transformer_mt.engines.torch_engine`) and :class:`CT2Engine`
(:mod:`~transformer_mt.engines.ct2_engine`).
"""

from collections.abc import Sequence
from pathlib import Path

from transformer_mt.checkpoint import check_checkpoint_path
from transformer_mt.config import check_device_name
from transformer_mt.engines.base import Engine
from transformer_mt.engines.ct2 import check_export_directory
from transformer_mt.engines.ct2_engine import CT2Engine
from transformer_mt.engines.options import ENGINES, ModelOptions
from transformer_mt.engines.torch_engine import TorchEngine
from transformer_mt.errors import MTError

__all__ = ["Engine", "check_engine", "load_engine"]


def load_engine(
    kind: str,
    path: Path | str | Sequence[Path | str],
    device: str = ModelOptions.device,
    quantize: str | None = ModelOptions.quantize,
    precision: str | None = ModelOptions.precision,
) -> Engine:
    """Load the engine ``kind`` from ``path``.

    ``kind`` "torch" (``path``: a checkpoint, or several: an ensemble) or "ct2" (``path``: an
    exported directory); ``quantize`` ("int8", torch only): dynamic int8 linear layers;
    ``precision`` (torch only; None: the checkpoint's decode.precision): see
    :func:`~transformer_mt.engines.loading.load_for_inference`. The options and their defaults
    are :class:`~transformer_mt.engines.options.ModelOptions`' (a caller with one passes its
    fields)."""
    paths = [path] if isinstance(path, str | Path) else list(path)
    if not paths:
        raise MTError("no model given: name a checkpoint (or an export directory) to load")
    if kind == "ct2" and len(paths) > 1:
        raise MTError("several --checkpoint needs --engine torch (checkpoints, not an export)")
    for each in paths:
        check_engine(kind, each, quantize, precision)
    if kind == "torch":
        return TorchEngine(paths, device, quantize, precision)
    return CT2Engine(paths[0], device)


def check_engine(
    kind: str,
    path: Path | str,
    quantize: str | None = None,
    precision: str | None = None,
    device: str | None = None,
) -> None:
    """The checks of :func:`load_engine` that load nothing.

    The engine's name, a file or a directory for it, quantization, precision and the device's
    spelling (its hardware is checked when the model loads): an MTError naming the option at
    fault."""
    if device is not None:
        check_device_name(device, "--device")
    for option, value in (("--quantize", quantize), ("--precision", precision)):
        if value is not None and kind != "torch":
            raise MTError(
                f"{option} is for --engine torch; CTranslate2 models are quantized by "
                "`mt export --quantization`"
            )
    if kind == "torch":
        check_checkpoint_path(path)
    elif kind == "ct2":
        check_export_directory(Path(path))
    else:
        raise MTError(f"--engine {kind!r}: expected {' or '.join(ENGINES)}")
