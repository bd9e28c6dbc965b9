"""The setting machinery: how a config field is declared, read back and checked.

A field is declared once with :func:`setting` (its default, help and allowed :class:`Range` or
choices); :func:`settings_of` reads the declarations back as :class:`Setting` records, and
:func:`check_settings` checks an instance against them. Nothing here knows a section of the
config (those are in :mod:`transformer_mt.config.schema`).
"""

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from transformer_mt.errors import MTError


@dataclass(frozen=True)
class Range:
    """The values a numeric config field accepts.

    ``lo``/``hi`` bound it (None: unbounded), each bound included unless ``*_open``; ``none_ok``
    also accepts null. Floats must also be finite.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    none_ok: bool = False

    def holds(self, value: Any) -> bool:
        if value is None:
            return self.none_ok
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return above and below

    def converted(self, unit: Callable[[float], float]) -> "Range":
        """The same range in another unit: each bound through ``unit`` (a value -> the same in it)."""
        lo = None if self.lo is None else unit(self.lo)
        hi = None if self.hi is None else unit(self.hi)
        return dataclasses.replace(self, lo=lo, hi=hi)

    def describe(self) -> str:
        """The range in words: "at least 1", "1 to 128", "in [0, 1)", "greater than 0"."""
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is None and self.hi is None:
            text = "any number"
        elif self.hi is None:
            text = f"greater than {lo}" if self.lo_open else f"at least {lo}"
        elif self.lo is None:
            text = f"less than {hi}" if self.hi_open else f"at most {hi}"
        elif not self.lo_open and not self.hi_open:
            text = f"{lo} to {hi}"
        else:
            text = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        return text + (" or null" if self.none_ok else "")


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


AT_LEAST_1, AT_LEAST_0 = Range(lo=1), Range(lo=0)
POSITIVE = Range(lo=0, lo_open=True)  # > 0
PROBABILITY = Range(lo=0.0, hi=1.0, hi_open=True)  # [0, 1): dropout, label smoothing, betas
SEED_63 = Range(0, 2**63 - 1)  # numpy needs >= 0; torch takes seed + step below 2**64

ANY_NUMBER = Range()  # a numeric field that takes every value (e.g. random.Random's seed)


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    range: Range | None = None,
    choices: tuple[str, ...] | None = None,
    option: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A config field declared once: its default, its help text and the values it accepts.

    ``range`` bounds a numeric field, ``choices`` lists a text field's values, and ``option``
    names the `mt translate` option that sets a decode field. Validation (:func:`check_settings`),
    the command-line help (:func:`option_help`), `mt config` and docs/CONFIG.md read only this.
    """
    if not help:
        raise TypeError("a setting needs its help text")
    metadata = {"help": help, "range": range, "choices": choices, "option": option}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One declared field, as validation and the documentation read it."""

    name: str
    type: Any
    default: Any  # the value a fresh instance has (a factory's result)
    help: str
    range: Range | None
    choices: tuple[str, ...] | None
    option: str | None


@functools.cache
def declared_settings(cls: type) -> dict[str, Setting]:
    """:func:`settings_of` by field name (read once per class)."""
    return {s.name: s for s in settings_of(cls)}


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The declared fields of the config dataclass ``cls``, in their order.

    Read once per class: every request to the server checks its decode settings through them.
    """
    return _settings_of(cls)


@functools.cache
def _settings_of(cls: type) -> tuple[Setting, ...]:
    """:func:`settings_of`, computed (without building a ``cls``: its checks may read these)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        Setting(
            name=f.name,
            type=hints[f.name],
            default=_fresh_value(f),
            help=f.metadata.get("help", ""),
            range=f.metadata.get("range"),
            choices=f.metadata.get("choices"),
            option=f.metadata.get("option"),
        )
        for f in dataclasses.fields(cls)
    )


def _fresh_value(f: dataclasses.Field) -> Any:
    """The value the field ``f`` has in a fresh instance: its default, or its factory's result."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@dataclass(frozen=True)
class Limit:
    """A caller's tighter upper bound on one decode setting, and what sets it (for its error)."""

    most: int | float
    setting: str  # named in the error, e.g. "the server's max_beam (mt serve --max-beam)"


def check_settings(
    section: str,
    obj: Any,
    names: Mapping[str, str] | None = None,
    limits: Mapping[str, Limit] | None = None,
    units: Mapping[str, Callable[[float], float]] | None = None,
) -> None:
    """Check every field of ``obj`` (a config dataclass) against its declared range or choices.

    ``names`` says how the caller calls a key in its error (default ``section.key``, with the
    declared option: ``decode.beam_size (--beam)``); ``limits`` narrow a range for this caller;
    ``units`` show a key's value and range in the unit its option takes, where its field keeps
    another (a function from the field's value to the option's: bytes -> KiB). A None left at a
    None default passes (an optional setting not given).

    Raises:
        MTError: one line naming the key, the value and the allowed values, e.g.
            ``model.n_head is 0; it must be at least 1``.
    """
    for declared in settings_of(type(obj)):
        value, key = getattr(obj, declared.name), declared.name
        if value is None and declared.default is None:
            continue
        name = setting_name(section, declared, names)
        if declared.choices is not None and value not in declared.choices:
            raise MTError(_choice_error(name, value, declared.choices))
        limit = (limits or {}).get(key)
        allowed = _narrowed(declared.range, limit)
        if allowed is not None and not allowed.holds(value):
            why = (
                f" ({limit.setting})" if limit is not None and allowed is not declared.range else ""
            )
            raise MTError(_range_error(name, value, allowed, (units or {}).get(key)) + why)


def _narrowed(allowed: Range | None, limit: Limit | None) -> Range | None:
    """``allowed`` with a caller's upper bound ``limit`` where that is tighter than its own."""
    if allowed is None or limit is None or (allowed.hi is not None and limit.most >= allowed.hi):
        return allowed
    return dataclasses.replace(allowed, hi=limit.most, hi_open=False)


def _range_error(
    name: str, value: Any, allowed: Range, unit: Callable[[float], float] | None
) -> str:
    """The line refusing ``value`` of the key ``name`` outside ``allowed``, both in ``unit``."""
    if unit is not None and isinstance(value, int | float):
        value, allowed = unit(value), allowed.converted(unit)
    shown = _number(value) if isinstance(value, int | float) else repr(value)
    finite = "finite and " if isinstance(value, float) and not math.isfinite(value) else ""
    return f"{name} is {shown}; it must be {finite}{allowed.describe()}"


def setting_name(section: str, declared: Setting, names: Mapping[str, str] | None) -> str:
    """How an error calls a key: the caller's name for it, or ``section.key (--option)``."""
    if names and declared.name in names:
        return names[declared.name]
    return f"{section}.{declared.name}" + (f" ({declared.option})" if declared.option else "")


def _choice_error(name: str, value: Any, choices: tuple[str, ...]) -> str:
    return f"{name}={value!r}: expected one of {', '.join(choices)}"


def allowed_values(declared: Setting, prefix: str = "") -> str:
    """The values a key accepts in words ("at least 1", "one of relu, gelu"), or ""."""
    if declared.choices is not None:
        return f"{prefix}one of {', '.join(declared.choices)}"
    if declared.range is not None:
        return f"{prefix}{declared.range.describe()}"
    return ""
