"""Which model translates, and how: the options `mt translate`, `mt evaluate` and `mt serve` share.

Each is declared once here (default, help, choices, option name). The command line builds its
options from these declarations (:func:`declared`), and the server's settings reuse them
(:func:`model_setting`), so that `--engine`, `--device`, `--quantize`, `--precision` and
`--target-lang` say and accept the same everywhere. Torch-free: the command line's options are
read before any model loads.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformer_mt.config import check_settings, setting


@dataclass(frozen=True)
class ModelOptions:
    """The model options of a translating command, checked as they are built."""

    engine: str = setting(
        "torch",
        "the model's engine: torch reads a checkpoint written by `mt train`, ct2 a directory "
        "written by `mt export`",
        choices=("torch", "ct2"),
        option="--engine",
    )
    device: str = setting("cpu", "the model's device (cpu, cuda, cuda:1)", option="--device")
    quantize: str | None = setting(
        None,
        "linear layers in int8, weights rounded per output row, activations per input row (a "
        "line's output does not depend on its batch, up to float rounding; CPU, torch engine)",
        choices=("int8",),
        option="--quantize",
    )
    precision: str | None = setting(
        None,
        "the products of the linear layers (torch engine): auto, fp32 or bf16, as "
        "decode.precision; default: the checkpoint's decode.precision",
        choices=("auto", "fp32", "bf16"),
        option="--precision",
    )
    target_lang: str | None = setting(
        None,
        "the language to translate into: needed by a model trained into several (its error "
        "lists them); /v1/model lists a served model's pairs",
        option="--target-lang",
    )

    def __post_init__(self) -> None:
        check_settings("ModelOptions", self, option_names())  # the device: when it loads


def option_names() -> dict[str, str]:
    """Each field's option, by field name: ``{"engine": "--engine", ...}``."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(ModelOptions)}


def declared(name: str) -> dataclasses.Field:
    """The declaration of the field ``name`` of :class:`ModelOptions`."""
    return next(f for f in dataclasses.fields(ModelOptions) if f.name == name)


def model_setting(name: str) -> Any:
    """The field ``name`` of :class:`ModelOptions`, for another settings class (the server's).

    The same default, help, choices and option: one declaration."""
    original = declared(name)
    return dataclasses.field(default=original.default, metadata=original.metadata)


def option_text(name: str) -> str:
    """The help of the option that sets ``name``: its declared help and the values it accepts."""
    metadata = declared(name).metadata
    text, choices = metadata["help"], metadata["choices"]
    text += f" ({' or '.join(choices)})" if choices else ""
    return text[:1].upper() + text[1:] + "."
