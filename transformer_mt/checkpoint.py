"""The checkpoint file: atomic save, safe load, averaging. Shared by training and inference.

A checkpoint is a plain dict that ``torch.load(weights_only=True)`` accepts (tensors, numbers,
strings, bytes, lists, dicts), so nothing in it can run code when loaded:

- ``model``: the state dict; ``model_args``: the Transformer's keyword arguments;
- ``config``: the resolved config as a dict; ``src_spm`` / ``trg_spm``: sentencepiece model bytes;
  ``special_ids``: the ids the vocabularies were built with;
- written by training: ``step`` and ``train_state`` (optimizer, scaler, RNG streams, data position,
  best metric); by averaging: ``averaged_from``.

State dicts of older versions (other parameter names) are upgraded when a model loads them
(``transformer_mt.model.upgrade_state_dict``).
"""

import pickle
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from transformer_mt.data.tokenizer import SPECIAL_IDS
from transformer_mt.errors import MTError
from transformer_mt.fileio import (
    atomic_write,
    check_output,
    is_no_space,
    no_space_error,
    output_file,
)
from transformer_mt.model import upgrade_state_dict

REQUIRED_KEYS = ("model", "model_args", "config", "src_spm", "trg_spm")


def save_checkpoint(
    ckpt: dict[str, Any], path: Path, *, inputs: Iterable[Path | str] | None = None
) -> None:
    """Write ``ckpt`` beside ``path``, flush it to disk, then rename it over ``path``: a crash
    mid-write leaves the previous file intact, never a truncated one.

    ``inputs`` marks ``path`` as a user-named output (:func:`transformer_mt.fileio.output_file`:
    refused when it is one of ``inputs``, written through symlinks, in place on a device). A full
    disk is one MTError naming the path and the checkpoint's size.
    """
    try:
        if inputs is None:
            with atomic_write(path, "wb", durable=True) as f:
                torch.save(ckpt, f)
        else:
            with output_file(path, "wb", inputs=inputs, durable=True) as f:
                torch.save(ckpt, f)
    except Exception as err:  # torch wraps a failed write in a RuntimeError
        if is_no_space(err):
            raise no_space_error(path, _saved_size(ckpt)) from err
        raise


class _ByteCounter:
    """A file-like sink that only counts what torch.save writes to it."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def _saved_size(ckpt: dict[str, Any]) -> int:
    """The size of ``ckpt`` as torch.save writes it (for the disk-full message)."""
    counter = _ByteCounter()
    torch.save(ckpt, counter)
    return counter.size


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``), with a one-line error for the user.

    A file that is not a checkpoint (random bytes, a truncated or empty file, a pickle of other
    Python objects) is refused with our own message: it is never loaded in any unsafe way.
    """
    path = Path(path)
    if path.is_dir():
        exported = (path / "transformer_mt.json").is_file()  # export.SETTINGS_FILE
        hint = " (an `mt export` directory: add --engine ct2)" if exported else ""
        raise MTError(
            f"checkpoint {path} is a directory{hint}; pass a .pt file written by `mt train`"
        )
    if not path.exists():
        raise MTError(f"checkpoint not found: {path}; pass a .pt file written by `mt train`")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickle protocols
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except OSError as err:
        if err.filename:
            raise  # the path itself failed (permission denied, ...): the CLI names it
        raise _not_a_checkpoint(path, "it is truncated or not a PyTorch file") from None
    except pickle.UnpicklingError as err:
        if "GLOBAL" in str(err):
            why = "it holds Python objects other than tensors, which are never loaded (they could run code)"
        else:
            why = "it is not a PyTorch checkpoint file"
        raise _not_a_checkpoint(path, why) from None
    except (EOFError, RuntimeError, ValueError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        if isinstance(err, RuntimeError) and "PytorchStreamReader" not in str(err):
            raise  # e.g. out of memory while loading: not the file's fault
        why = "it is empty" if isinstance(err, EOFError) else "it is truncated or corrupt"
        raise _not_a_checkpoint(path, why) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise MTError(f"{path} is not a transformer-mt checkpoint (missing {', '.join(missing)})")
    if ckpt.get("special_ids", SPECIAL_IDS) != SPECIAL_IDS:
        raise MTError(f"{path}: special ids {ckpt['special_ids']} differ from {SPECIAL_IDS}")
    return ckpt


def _not_a_checkpoint(path: Path, why: str) -> MTError:
    return MTError(
        f"cannot load checkpoint {path}: {why}; pass a .pt file written by `mt train` "
        "(or `mt average`)"
    )


def average_checkpoints(paths: list[Path], output: Path, *, other_runs: bool = False) -> None:
    """Average the weights of several checkpoints of the same model into ``output`` (without
    training state: the average is for translating, not for resuming). Its ``step`` is the
    latest of theirs.

    Checkpoints of one run only (weights of independent runs do not average into a model): a
    file whose training seed or data fingerprint differs from the first's is refused unless
    ``other_runs``; so is a file given twice (it would count double).
    """
    if not paths:
        raise MTError("mt average needs at least one checkpoint")
    check_output(output, inputs=paths)  # before any work: never over one of the inputs
    _refuse_repeats(paths)
    first = load_checkpoint(paths[0])
    first_weights = _weights(first, paths[0])
    total = {k: v.double() for k, v in first_weights.items()}
    steps = [first.get("step")]
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        weights = _weights(ckpt, path)
        if ckpt["model_args"] != first["model_args"] or weights.keys() != total.keys():
            raise MTError(
                f"{path}: a different model than {paths[0]}; average only one run's files"
            )
        if ckpt["src_spm"] != first["src_spm"] or ckpt["trg_spm"] != first["trg_spm"]:
            raise MTError(
                f"{path}: another tokenizer than {paths[0]}; average only one run's files"
            )
        differs = _other_run(first, ckpt)
        if differs and not other_runs:
            raise MTError(
                f"{path}: another run than {paths[0]} ({differs}); average one run's "
                "checkpoints, or pass --other-runs if these runs share their start"
            )
        for k, v in weights.items():
            if v.shape != total[k].shape:
                raise MTError(f"{path}: {k} has shape {tuple(v.shape)}, {paths[0]} "
                              f"{tuple(total[k].shape)}; the file is damaged or another model's")  # fmt: skip
            total[k] += v.double()
        steps.append(ckpt.get("step"))
    averaged = {k: (v / len(paths)).to(first_weights[k].dtype) for k, v in total.items()}
    out = {k: v for k, v in first.items() if k != "train_state"}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    if all(isinstance(step, int) for step in steps):
        out["step"] = max(steps)
    save_checkpoint(out, output, inputs=paths)


def _refuse_repeats(paths: list[Path]) -> None:
    """A checkpoint named twice (even by two paths) would count twice in the average."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            st = Path(path).stat()
        except OSError:
            continue  # load_checkpoint names the problem
        if (st.st_dev, st.st_ino) in seen:
            raise MTError(f"{path} is {seen[st.st_dev, st.st_ino]} again: name each file once")
        seen[st.st_dev, st.st_ino] = path


def _weights(ckpt: dict, path: Path) -> dict:
    """The checkpoint's model weights (renamed keys upgraded), or an MTError naming the file."""
    model = ckpt["model"]
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise MTError(f"{path}: its model entry is not a dict of tensors; the file is damaged")
    return upgrade_state_dict(model)


def _other_run(first: dict, ckpt: dict) -> str:
    """Why ``ckpt`` comes from another training run than ``first`` ("" when nothing says so):
    another seed, or another data fingerprint where both record one."""
    seeds = [c.get("config", {}).get("train", {}).get("seed") for c in (first, ckpt)]
    if seeds[0] != seeds[1]:
        return f"train.seed {seeds[1]} against {seeds[0]}"
    prints = [c.get("train_state", {}).get("data_fingerprint") for c in (first, ckpt)]
    if None not in prints and prints[0] != prints[1]:
        return "trained on other data"
    return ""
