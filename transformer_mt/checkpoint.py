"""The checkpoint file: atomic save, safe load, averaging. Shared by training and inference.

A checkpoint is a plain dict that ``torch.load(weights_only=True)`` accepts (tensors, numbers,
strings, bytes, lists, dicts), so nothing in it can run code when loaded:

- ``model``: the state dict; ``model_args``: the Transformer's shape as the seeds' keyword
  arguments (``TransformerConfig.to_args``);
- ``config``: the resolved config as a dict; ``src_spm`` / ``trg_spm``: sentencepiece model bytes;
  ``special_ids``: the ids the vocabularies were built with;
- written by `mt import`: ``imported_from`` ({format, source}) and ``step`` 0;
- written by training: ``step`` and ``train_state`` (optimizer, scaler, RNG streams, data position,
  best metric); by averaging: ``averaged_from``.

State dicts of older versions (other parameter names) are upgraded when a model loads them
(``transformer_mt.model.upgrade_state_dict``).

Every command loads through :func:`load_checkpoint`, which checks the whole file against one
schema (:func:`validate_checkpoint`: the type of every field a command reads) and every weight
for NaN/Inf (:func:`check_finite`); :func:`save_checkpoint` refuses to write non-finite weights.
"""

import io
import math
import pickle
import random
import types
import typing
import warnings
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from transformer_mt.config import config_from_dict, validate_decode
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
from transformer_mt.model.transformer_config import argument_types

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

REQUIRED_KEYS = ("model", "model_args", "config", "src_spm", "trg_spm")


def save_checkpoint(
    ckpt: dict[str, Any], path: Path, *, inputs: Iterable[Path | str] | None = None
) -> None:
    """Write ``ckpt`` beside ``path``, flush it to disk, then rename it over ``path``.

    A crash mid-write leaves the previous file intact, never a truncated one.

    ``inputs`` marks ``path`` as a user-named output (:func:`transformer_mt.fileio.output_file`:
    refused when it is one of ``inputs``, written through symlinks, in place on a device). A full
    disk is one MTError naming the path and the checkpoint's size; so are weights that hold NaN
    or Inf (diverged training): nothing is written, a file already at ``path`` stays as it was.
    """
    if isinstance(ckpt.get("model"), Mapping):
        check_finite(ckpt["model"], path, saving=True)
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


class _ByteCounter(io.BytesIO):
    """A binary file that only counts what torch.save writes to it, keeping none of it."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def write(self, data: "ReadableBuffer", /) -> int:
        """Count ``data``'s bytes; returns that count, as a file's write does."""
        n = memoryview(data).nbytes
        self.size += n
        return n


def _saved_size(ckpt: dict[str, Any]) -> int:
    """The size of ``ckpt`` as torch.save writes it (for the disk-full message)."""
    counter = _ByteCounter()
    torch.save(ckpt, counter)
    return counter.size


# What torch.load raises for bytes that are not a whole checkpoint (IndexError, KeyError: the
# unpickler's stack or memo, read from bytes that are no pickle); a RuntimeError only with one of
# these messages (others, such as running out of memory, are not the file's fault).
_CORRUPT = (
    EOFError,
    RuntimeError,
    ValueError,
    zipfile.BadZipFile,
    UnicodeDecodeError,
    IndexError,
    KeyError,
)
_CORRUPT_RUNTIME = ("PytorchStreamReader", "magic number")


def check_checkpoint_path(path: Path | str) -> Path:
    """``path`` as a Path, or a one-line MTError where it cannot be a checkpoint.

    A directory, or nothing, cannot."""
    path = Path(path)
    if path.is_dir():
        exported = (path / "transformer_mt.json").is_file()  # engines.ct2.SETTINGS_FILE
        hint = " (an `mt export` directory: add --engine ct2)" if exported else ""
        raise MTError(
            f"checkpoint {path} is a directory{hint}; pass a .pt file written by `mt train`"
        )
    if not path.exists():
        raise MTError(f"checkpoint not found: {path}; pass a .pt file written by `mt train`")
    return path


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``), with a one-line error for the user.

    A file that is not a checkpoint (random bytes, a truncated or empty file, a pickle of other
    Python objects) is refused with our own message: it is never loaded in any unsafe way. So is
    one whose fields do not fit the schema (:func:`validate_checkpoint`) or whose weights hold
    NaN or Inf (:func:`check_finite`): every command loads through here, and none of them gets
    a file it would fail on with a traceback, or translate with garbage.
    """
    path = check_checkpoint_path(path)
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
    except _CORRUPT as err:
        if isinstance(err, RuntimeError) and not any(m in str(err) for m in _CORRUPT_RUNTIME):
            raise  # e.g. out of memory while loading: not the file's fault
        why = "it is empty" if isinstance(err, EOFError) else "it is truncated or corrupt"
        raise _not_a_checkpoint(path, why) from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise MTError(f"{path} is not a transformer-mt checkpoint (missing {', '.join(missing)})")
    validate_checkpoint(ckpt, path)
    check_finite(ckpt["model"], path)
    return ckpt


def _not_a_checkpoint(path: Path, why: str) -> MTError:
    return MTError(
        f"cannot load checkpoint {path}: {why}; pass a .pt file written by `mt train` "
        "(or `mt average`)"
    )


def average_checkpoints(paths: list[Path], output: Path, *, other_runs: bool = False) -> None:
    """Average the weights of several checkpoints of the same model into ``output``.

    It has no training state: the average is for translating, not for resuming. Its
    ``step`` is the latest of theirs.

    Checkpoints of one run only (weights of independent runs do not average into a model): a
    file whose training seed or data fingerprint differs from the first's is refused unless
    ``other_runs``; so is a file given twice (it would count double).
    """
    if not paths:
        raise MTError("mt average needs at least one checkpoint")
    check_output(output, inputs=paths)  # before any work: never over one of the inputs
    _refuse_repeats(paths)
    first = load_checkpoint(paths[0])  # types and finite weights checked: one schema
    first_weights = _weights(first)
    total = {k: v.double() for k, v in first_weights.items()}
    steps = [first.get("step")]
    for path in paths[1:]:
        ckpt = load_checkpoint(path)
        weights = _weights(ckpt)
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
                raise MTError(
                    f"{path}: {k} has shape {tuple(v.shape)}, {paths[0]} "
                    f"{tuple(total[k].shape)}; the file is damaged or another model's"
                )
            total[k] += v.double()
        steps.append(ckpt.get("step"))
    averaged = {k: (v / len(paths)).to(first_weights[k].dtype) for k, v in total.items()}
    out = {k: v for k, v in first.items() if k != "train_state"}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    known = [step for step in steps if isinstance(step, int)]
    if len(known) == len(steps):
        out["step"] = max(known)
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


def _weights(ckpt: dict) -> dict:
    """The checkpoint's model weights, renamed keys upgraded (the schema checked their types)."""
    return upgrade_state_dict(ckpt["model"])


def _other_run(first: dict, ckpt: dict) -> str:
    """Why ``ckpt`` comes from another training run than ``first`` ("" when nothing says so).

    Another seed, or another data fingerprint where both record one."""
    seeds = [c.get("config", {}).get("train", {}).get("seed") for c in (first, ckpt)]
    if seeds[0] != seeds[1]:
        return f"train.seed {seeds[1]} against {seeds[0]}"
    prints = [c.get("train_state", {}).get("data_fingerprint") for c in (first, ckpt)]
    if None not in prints and prints[0] != prints[1]:
        return "trained on other data"
    return ""


# ------------------------------------------------------------------- the schema of a checkpoint

Rule = tuple[Callable[[Any], bool], str]  # (does a value fit?, what is expected, for people)


def _is_int(value: Any) -> bool:
    """An integer, not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    """An integer >= 0."""
    return _is_int(value) and value >= 0


def _is_dense(value: Any) -> bool:
    """A plain tensor (what a state dict holds), not a sparse or quantized one."""
    return (
        isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_quantized
    )


def _is_texts(value: Any) -> bool:
    """A dict of strings to strings."""
    return isinstance(value, dict) and all(isinstance(x, str) for x in (*value, *value.values()))


def _list_of(rule: Rule, what: str) -> Rule:
    """A list whose every item fits ``rule``; ``what`` names it in errors."""
    return (lambda v: isinstance(v, list) and all(map(rule[0], v))), what


def _or_none(rule: Rule) -> Rule:
    """``rule``, or null."""
    return (lambda v: v is None or rule[0](v)), f"{rule[1]} or null"


COUNT: Rule = (_is_count, "an integer >= 0")
NUMBER: Rule = (_is_number, "a number")
TEXT: Rule = (lambda v: isinstance(v, str), "a string")
DICT: Rule = (lambda v: isinstance(v, dict), "a dict")
TENSOR: Rule = (_is_dense, "a tensor")
SETTINGS: Rule = (lambda v: isinstance(v, dict) and all(map(TEXT[0], v)), "a dict of settings")
WEIGHTS: Rule = (lambda v: isinstance(v, dict) and bool(v), "a dict of named tensors")
# train_state["init_from"] of a fine-tuning run: the file it started from.
INIT_FROM: Rule = (
    lambda v: (
        isinstance(v, dict)
        and TEXT[0](v.get("path"))
        and TEXT[0](v.get("sha256"))
        and (v.get("step") is None or _is_count(v.get("step")))
    ),
    "a dict of the path, sha256 and step of a checkpoint",
)

# The top-level fields besides model, model_args, config and train_state (checked on their own).
FIELDS: dict[str, Rule] = {
    "src_spm": ((lambda v: isinstance(v, bytes) and bool(v)), "a sentencepiece model's bytes"),
    "trg_spm": ((lambda v: isinstance(v, bytes) and bool(v)), "a sentencepiece model's bytes"),
    "special_ids": (lambda v: isinstance(v, dict) and all(map(TEXT[0], v)), "a dict of ids"),
    "step": COUNT,
    "averaged_from": _list_of(TEXT, "a list of file names"),
    "lang_tags": _or_none((_is_texts, "a dict of language -> tag piece")),  # multilingual runs
    # `mt import`: what the checkpoint was converted from ({"format": "hf-marian", "source"})
    "imported_from": (_is_texts, "a dict of the format and source it was imported from"),
}
# train_state["state"]: the fields of transformer_mt.training.state.TrainState (a test checks
# that the two agree); each entry of "history" is a step and its validation results.
RUN_STATE: dict[str, Rule] = {
    "step": COUNT,
    "epoch": COUNT,
    "batch_in_epoch": COUNT,
    "best": _or_none(NUMBER),
    "best_metric": _or_none(TEXT),
    "bad_validations": COUNT,
    "nonfinite_in_a_row": COUNT,
    "train_seconds": NUMBER,
    "warmup_seconds": _or_none(NUMBER),
    "history": _list_of(DICT, "a list of validation results"),
}
# Token ids must index their vocabulary (a padding id past it fails inside nn.Embedding).
_VOCAB_OF = {
    "src_pad_idx": "enc_voc_size",
    "trg_pad_idx": "dec_voc_size",
    "trg_sos_idx": "dec_voc_size",
}


def validate_checkpoint(ckpt: dict[str, Any], path: Path | str) -> None:
    """Check ``ckpt`` as a whole against the one schema of the format.

    The schema covers the type (and the range, where a wrong one would fail later) of every field
    that a command reads, so that no command meets a field it cannot use. A field that does not fit
    is a one-line MTError naming it: "damaged checkpoint FILE: field step is the string '12',
    expected an integer >= 0; ...".

    ``model`` holds tensors; ``model_args`` the Transformer's keyword arguments, each of its
    annotated type; ``config`` sections of settings, each of its config type; the other fields
    follow ``FIELDS``, and ``train_state`` (optional) what a resume reads.
    """
    path = Path(path)
    _expect(path, "model", ckpt["model"], WEIGHTS)
    for name, tensor in ckpt["model"].items():
        if not isinstance(name, str):
            raise _damaged(path, f"field model names a tensor {name!r}, expected a string")
        _expect(path, f"model.{name}", tensor, TENSOR)
    _check_model_args(path, ckpt["model_args"])
    _check_config(path, ckpt["config"])
    for key, rule in FIELDS.items():
        if key in ckpt:
            _expect(path, key, ckpt[key], rule)
    if ckpt.get("special_ids", SPECIAL_IDS) != SPECIAL_IDS:  # another toolkit's vocabularies
        raise MTError(f"{path}: special ids {ckpt['special_ids']} differ from {SPECIAL_IDS}")
    if "train_state" in ckpt:
        _check_train_state(path, ckpt["train_state"])


def check_finite(weights: Mapping[str, Any], path: Path | str, *, saving: bool = False) -> None:
    """Raise a one-line MTError naming the first tensor of ``weights`` that holds NaN or Inf.

    That is a damaged checkpoint when loading, diverged weights not written when ``saving``. Tied
    weights (one tensor under several names) are read once."""
    seen: set[tuple[Any, ...]] = set()
    for name, tensor in weights.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        key = (tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
        if key in seen:
            continue
        seen.add(key)
        if not _is_finite(tensor):
            if saving:
                raise MTError(
                    f"not writing {path}: tensor {name} holds NaN/Inf (the weights diverged); the "
                    "file there, if any, is left as it was (resume from it with a lower "
                    "learning rate)"
                )
            raise _damaged(Path(path), f"tensor {name} holds NaN/Inf")


def _is_finite(tensor: torch.Tensor) -> bool:
    """Whether no element of ``tensor`` is NaN or Inf.

    ``aminmax`` reads the tensor once and allocates nothing of its size, and NaN propagates to
    both results. For the 60.5M fp32 parameters of a Transformer-base checkpoint (32k joint
    vocabulary) on 2 cores of this project's CPU: 17 ms (best of 9; torch.load takes 130 ms),
    against 220 ms for ``isfinite(t).all()``, which builds a boolean copy of each tensor.
    """
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return True  # integers are finite (and an empty tensor has no minimum)
    if tensor.is_complex():
        return bool(torch.isfinite(tensor).all())
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def _damaged(path: Path, what: str) -> MTError:
    return MTError(
        f"damaged checkpoint {path}: {what}; use an intact copy or another checkpoint of the run"
    )


def _expect(path: Path, field: str, value: Any, rule: Rule) -> None:
    """Raise the schema's MTError, naming ``field``, unless ``value`` fits ``rule``."""
    if not rule[0](value):
        raise _damaged(path, f"field {field} is {_describe(value)}, expected {rule[1]}")


def _describe(value: Any) -> str:
    """A value as the schema's errors name it: its type, and a short form of small values."""
    if value is None or isinstance(value, bool):
        return str(value).lower().replace("none", "null")
    if isinstance(value, int | float):
        return f"the {'integer' if isinstance(value, int) else 'number'} {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    for kind in (list, tuple, dict):
        if isinstance(value, kind):
            return f"a {kind.__name__} of {len(value)} item(s)"
    return f"a value of type {type(value).__name__}"


def _model_arg_rule(name: str, hint: Any, args: dict[str, Any]) -> Rule:
    """What model argument ``name`` (annotated ``hint``) must be.

    Of that type, and in the range that the constructor assumes without checking it (sizes >= 1,
    probabilities in [0, 1], ids inside their vocabulary)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _or_none(_model_arg_rule(name, inner, args))
    if hint is bool:
        return (lambda v: isinstance(v, bool)), "true or false"
    if hint is float and name.endswith("_prob"):
        return (lambda v: _is_number(v) and 0 <= v <= 1), "a number in [0, 1]"
    if hint is float:
        return (lambda v: _is_number(v) and math.isfinite(v)), "a finite number"
    if hint is int and name in _VOCAB_OF:
        size = args.get(_VOCAB_OF[name])
        limit = size if _is_int(size) else math.inf
        return (lambda v: _is_count(v) and v < limit), f"an integer in [0, {_VOCAB_OF[name]})"
    if hint is int:
        least = 2 if name == "max_len" else 1  # max_len: BOS or EOS and one token
        return (lambda v: _is_int(v) and v >= least), f"an integer >= {least}"
    return (lambda v: isinstance(v, hint)), f"a {getattr(hint, '__name__', hint)}"


def _check_model_args(path: Path, args: Any) -> None:
    """``model_args``: the Transformer's keyword arguments, each of its type and range."""
    _expect(
        path, "model_args", args, (lambda v: isinstance(v, dict), "a dict of the model's arguments")
    )
    params = argument_types()
    for name, value in args.items():
        if name not in params:
            raise _damaged(path, f"field model_args.{name} is not an argument of this model")
        _expect(path, f"model_args.{name}", value, _model_arg_rule(name, params[name][0], args))
    missing = [name for name, (_, required) in params.items() if required and name not in args]
    if missing:
        raise _damaged(path, f"field model_args.{missing[0]} is missing")


def _check_config(path: Path, config: Any) -> None:
    """Check ``config``: a name and sections of settings, each setting of its config type.

    Also decoding defaults that `mt translate` and `mt serve` can use."""
    _expect(path, "config", config, (lambda v: isinstance(v, dict), "a dict of config sections"))
    for section, body in config.items():
        _expect(path, f"config.{section}", body, TEXT if section == "name" else SETTINGS)
    try:  # each setting's type, as `mt translate` reads them; the decode defaults' ranges
        validate_decode(config_from_dict(config).decode)
    except MTError as err:
        raise _damaged(path, str(err)) from None


def _check_train_state(path: Path, state: Any) -> None:
    """``train_state``: what a resume reads (optimizer, scaler, run state, generators)."""
    _expect(path, "train_state", state, (DICT[0], "a dict (or no such field)"))
    for key in ("optimizer", "scaler", "state", "rng"):
        _expect(path, f"train_state.{key}", state.get(key), DICT)
    groups = state["optimizer"].get("param_groups")
    _expect(path, "train_state.optimizer.param_groups", groups, _list_of(DICT, "a list of dicts"))
    for i, group in enumerate(groups):
        field = f"train_state.optimizer.param_groups[{i}].params"
        _expect(path, field, group.get("params"), _list_of((_is_int, ""), "a list of integers"))
    _expect(path, "train_state.optimizer.state", state["optimizer"].get("state"), DICT)
    _check_run_state(path, state["state"])
    per_rank = state.get("rng_per_rank", [state["rng"]])
    _expect(path, "train_state.rng_per_rank", per_rank, _list_of(DICT, "a list of dicts"))
    for i, rng in enumerate([state["rng"], *per_rank]):
        _check_rng(path, f"train_state.rng_per_rank[{i - 1}]" if i else "train_state.rng", rng)
    digests = (lambda v: isinstance(v, dict) and all(map(TEXT[0], v.values())), "a dict of digests")
    _expect(path, "train_state.data_fingerprint", state.get("data_fingerprint"), _or_none(digests))
    if "init_from" in state:
        _expect(path, "train_state.init_from", state["init_from"], INIT_FROM)


def _check_run_state(path: Path, state: dict[str, Any]) -> None:
    """``train_state.state``: TrainState's fields, of their types (``RUN_STATE``)."""
    for key, value in state.items():
        if key not in RUN_STATE:
            raise _damaged(path, f"field train_state.state.{key} is not known to this version")
        _expect(path, f"train_state.state.{key}", value, RUN_STATE[key])
    for i, entry in enumerate(state.get("history", [])):
        _expect(path, f"train_state.state.history[{i}].step", entry.get("step"), COUNT)
        for key, value in entry.items():
            _expect(path, f"train_state.state.history[{i}].{key}", value, NUMBER)


def _check_rng(path: Path, field: str, rng: dict[str, Any]) -> None:
    """Check a generator state as a resume restores it.

    Torch's state bytes, Python's state tuple, and where present the GPU's (one state, or one per
    GPU in older checkpoints)."""
    if "cuda" in rng:
        states = (lambda v: _is_dense(v) or _list_of(TENSOR, "")[0](v), "tensor(s)")
        _expect(path, f"{field}.cuda", rng["cuda"], states)
    _expect(
        path, f"{field}.torch", rng.get("torch"), (_torch_state_fits, "torch's generator state")
    )
    _expect(
        path, f"{field}.python", rng.get("python"), (_python_state_fits, "Python's generator state")
    )


def _torch_state_fits(value: Any) -> bool:
    """Whether torch's CPU generator takes ``value`` as its state."""
    if not (_is_dense(value) and value.dtype == torch.uint8):
        return False
    try:
        torch.Generator().set_state(value.cpu())
    except RuntimeError:
        return False
    return True


def _python_state_fits(value: Any) -> bool:
    """Whether Python's ``random`` takes ``value`` as its state."""
    if not isinstance(value, tuple):
        return False
    try:
        random.Random().setstate(value)
    except (TypeError, ValueError, LookupError, OverflowError):  # what setstate's parsing raises
        return False
    return True
