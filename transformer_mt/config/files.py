"""Configs in and out: YAML files, shipped recipes, ``--set`` overrides, checkpoint dicts.

:func:`load_config` builds a :class:`~transformer_mt.config.schema.Config` from its defaults, a
YAML file (or a shipped recipe by name) and ``section.key=value`` overrides, each value checked
against its field's type; :func:`apply_overrides` changes decode settings the same way;
:func:`save_config` and :func:`config_yaml` write a config back. YAML is read as YAML 1.2 reads
it (:class:`_Loader`).
"""

import dataclasses
import importlib.resources
import os
import re
import textwrap
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from transformer_mt.config.schema import LOCAL_FILE_KEYS, SPLITS, Config, DataConfig, DecodeConfig
from transformer_mt.config.settings import (
    Limit,
    Setting,
    allowed_values,
    declared_settings,
    setting_name,
    settings_of,
)
from transformer_mt.config.validation import validate, validate_decode
from transformer_mt.errors import MTError
from transformer_mt.fileio import decode_utf8, write_text_atomic


def _check_type(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` (int is accepted for float) or raise naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        others = [arg for arg in args if arg is not type(None)]
        if len(others) == 1 and typing.get_origin(others[0]) is list:
            return _check_type(value, others[0], key)  # its own error names the item
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(value, arg, key)
            except MTError:
                pass
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {_shown(value)}")
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, dict) and dataclasses.is_dataclass(item):
            value = [value]  # one source may be written without the list around it
        if not isinstance(value, list):
            raise MTError(f"config key {key!r}: expected a list, got {_shown(value)}")
        return [_check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build_dataclass(tp, value, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected true/false, got {_shown(value)}")
    if tp is int and isinstance(value, bool):
        raise MTError(f"config key {key!r}: expected an integer, got {_shown(value)}")
    if not isinstance(value, tp):
        raise MTError(f"config key {key!r}: expected {_type_name(tp)}, got {_shown(value)}")
    return value


def _build_dataclass(cls: type, value: Any, key: str) -> Any:
    """An instance of ``cls`` from a mapping of its keys (a list item such as one source)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise MTError(f"config key {key!r}: expected a mapping of keys, got {_shown(value)}")
    obj, hints = cls(), _section_types(cls)
    for name, item in value.items():
        if name not in hints:
            raise MTError(f"unknown config key '{key}.{name}'; known keys: {', '.join(hints)}")
        setattr(obj, name, _check_type(item, hints[name], f"{key}.{name}"))
    return obj


def _shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error line shows it: its repr on one line, cut at ``limit`` characters.

    (A tensor's or array's repr spans several lines; an error is one line.)"""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _apply(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    """Set ``section.key`` to ``value`` after checking that both exist and the type fits."""
    sections = {k: v for k, v in _section_types(Config).items() if k != "name"}
    if section not in sections:
        known = ", ".join(sections)
        raise MTError(f"{where}unknown config section {section!r}; known: name, {known}")
    obj = getattr(cfg, section)
    hints = _section_types(type(obj))
    if key not in hints:
        raise MTError(
            f"{where}unknown config key '{section}.{key}'; known keys: {', '.join(hints)}"
        )
    setattr(obj, key, _check_type(value, hints[key], f"{section}.{key}"))


DEFAULT_RECIPE = "toy"  # the recipe `mt train` trains when no --config is given


def _recipes_dir() -> Path:
    # Package data (transformer_mt/configs/, linked from configs/ in a checkout). An installed
    # package is plain files (pip never installs zipped), so the resource is a real path.
    return Path(str(importlib.resources.files("transformer_mt") / "configs"))


def recipe_names() -> list[str]:
    """The names of the recipes shipped with the package ("toy", "multi30k_de_en", ...)."""
    return sorted(p.stem for p in _recipes_dir().glob("*.yaml"))


def recipe_path(name: str = DEFAULT_RECIPE) -> Path:
    """The YAML file of the shipped recipe ``name``, wherever the package is installed."""
    if name not in recipe_names():
        raise MTError(f"no shipped recipe {name!r}; known: {', '.join(recipe_names())}")
    return _recipes_dir() / f"{name}.yaml"


def find_config(path: Path | str) -> Path:
    """The config file that a ``--config`` value names.

    ``path`` when it is a file; else, for a bare name such as ``multi30k_de_en``, the shipped
    recipe of that name (so ``--config multi30k_de_en`` works from any directory).
    """
    path = Path(path)
    if path.is_file():
        return path
    if str(path) == path.name and not path.suffix and path.name in recipe_names():
        return recipe_path(path.name)
    raise MTError(
        f"config file not found: {path}; pass an existing YAML file to --config, "
        f"or the name of a shipped recipe ({', '.join(recipe_names())})"
    )


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading plain scalars and repeated keys as YAML 1.2 says.

    ``1e-4`` is a float, only true/false are booleans, integers are decimal (``010`` is 10;
    ``0o``/``0x`` prefixes, ``_`` between digits), no base-60. (PyYAML follows YAML 1.1, where
    ``1e-4`` is text, ``no``, ``on`` and ``y`` are booleans and ``1:30`` is 90: ``--set
    train.weight_decay=1e-4`` or ``data.trg_lang: no`` would fail.) A key repeated in one mapping
    is an error, as YAML 1.2 says (PyYAML keeps the last one: a second ``train:`` section would
    silently replace the first).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue  # merge keys (<<) may override; other keys are refused below anyway
            key = self.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} is repeated: first on line {first_line[key]}",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """Writes what :class:`_Loader` reads back unchanged (quotes the text ``1e5``, say)."""


_BOOL, _INT, _FLOAT, _MERGE = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "merge"))
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    _INT,
    re.compile(r"^[-+]?(?:[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    return int(text, 0) if text.lstrip("+-")[:2] in ("0o", "0x") else int(text)  # 010 is 10


_Loader.add_constructor(_INT, _construct_int)
_Dumper.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only


def load_config(path: Path | str | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from defaults, then the YAML file (if any), then ``key=value`` overrides.

    ``path`` is a YAML file or a shipped recipe's name (:func:`find_config`); None keeps the
    dataclass defaults (the command line's default is the toy recipe: :func:`recipe_path`).
    """
    cfg = Config()
    if path is not None:
        if Path(path).is_dir():
            raise MTError(f"--config {path} is a directory; pass a YAML file")
        path = find_config(path)
        try:
            raw = _load_yaml(decode_utf8(path.read_bytes(), path)) or {}
        except yaml.YAMLError as err:
            raise MTError(f"{path}{_yaml_problem(err)}; fix the YAML syntax there") from None
        if not isinstance(raw, dict):
            raise MTError(f"{path}: expected a mapping of sections at the top level")
        _apply_sections(cfg, raw, f"{path}: ")
        if "name" not in raw:
            cfg.name = path.stem
    for item in overrides or []:
        apply_override(cfg, item)
    _expand_home(cfg.data)
    validate(cfg)
    return cfg


def _expand_home(data_cfg: DataConfig) -> None:
    """Expand ``~`` in the data paths to the home directory, as a shell does.

    The shell does not expand it inside ``--set data.cache_dir=~/x``, and YAML never does.
    """
    for f in dataclasses.fields(data_cfg):
        value = getattr(data_cfg, f.name)
        if f.name in _DATA_PATHS and isinstance(value, str):
            setattr(data_cfg, f.name, os.path.expanduser(value))
    for split in SPLITS:
        for source in getattr(data_cfg, split) or []:
            for key in _SOURCE_PATHS:
                value = getattr(source, key)
                if isinstance(value, str):
                    setattr(source, key, os.path.expanduser(value))


# Every data path, and a source's (``~`` in them is the home directory).
_DATA_PATHS = ("download_dir", "cache_dir", *LOCAL_FILE_KEYS)
_SOURCE_PATHS = ("src", "trg", "tsv", "jsonl", "parquet", "tmx", "archive", "hf")


def _yaml_problem(err: yaml.YAMLError, where: str = "line") -> str:
    """``:LINE: invalid YAML (problem)`` for a file, `` (problem)`` for a --set value."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if where and mark is not None:
        return f":{mark.line + 1}: invalid YAML ({problem})"
    return f": invalid YAML ({problem})" if where else f" ({problem})"


def apply_override(cfg: Config, item: str) -> None:
    """Apply one ``section.key=value`` override; the value is parsed as YAML (``1e-3``, ``true``)."""
    if "=" not in item:
        raise MTError(f"--set {item!r}: expected section.key=value, e.g. train.max_steps=100")
    dotted, text = item.split("=", 1)
    try:
        value = _load_yaml(text) if text.strip() else ""
    except yaml.YAMLError as err:
        raise MTError(
            f"--set {item!r}: the value is not valid YAML{_yaml_problem(err, where='')}; write "
            f"a number, true/false, or text in quotes (--set '{dotted}=\"...\"')"
        ) from None
    if dotted == "name":
        cfg.name = _check_type(value, str, "name")
        return
    if "." not in dotted:
        raise MTError(f"--set {item!r}: expected section.key=value, e.g. train.max_steps=100")
    section, key = dotted.split(".", 1)
    _apply(cfg, section, key, value, "--set: ")


def apply_overrides(
    base: DecodeConfig,
    overrides: Mapping[str, Any],
    limits: Mapping[str, Limit] | None = None,
    names: Mapping[str, str] | None = None,
) -> DecodeConfig:
    """``base`` with ``overrides`` (None keeps base's value), checked as one config.

    The one path by which `mt translate` / `evaluate` / `score` and both server APIs change a
    model's decode settings. Each value is checked against its field's type and declared range,
    narrowed by the caller's ``limits`` (a server's max_beam), then the rules across fields
    (:func:`validate_decode`).
    ``names`` says how the caller calls each key in its errors (a request field, an option).
    """
    declared = declared_settings(DecodeConfig)
    changes = {}
    for key, value in overrides.items():
        if key not in declared:
            raise MTError(f"unknown decode setting {key!r}; known: {', '.join(declared)}")
        if value is not None:
            name = setting_name("decode", declared[key], names)
            changes[key] = _check_type(value, declared[key].type, name)
    decode = dataclasses.replace(base, **changes)
    validate_decode(decode, names, limits)
    return decode


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Rebuild a Config from ``Config.to_dict()`` output (e.g. stored in a checkpoint)."""
    cfg = Config()
    if not isinstance(raw, dict):
        raise MTError("checkpoint config: expected a mapping of sections")
    _apply_sections(cfg, raw, "checkpoint config: ")
    return cfg


def _apply_sections(cfg: Config, raw: dict[Any, Any], where: str) -> None:
    """Set ``cfg`` from a mapping of sections (and ``name``); errors start with ``where``."""
    for section, body in raw.items():
        if section == "name":
            cfg.name = _check_type(body, str, "name")
            continue
        if not isinstance(body, dict):
            raise MTError(f"{where}section {section!r} must be a mapping of keys")
        for key, value in body.items():
            _apply(cfg, str(section), str(key), value, where)


def save_config(cfg: Config, path: Path) -> None:
    """Write ``cfg`` as YAML, atomically (never a half-written file, a full disk named)."""
    write_text_atomic(path, yaml.dump(cfg.to_dict(), Dumper=_Dumper, sort_keys=False))


def config_yaml(cfg: Config) -> str:
    """``cfg`` as YAML, every key with its help as a comment; it loads back as ``cfg``.

    Each key's comment holds its help and allowed values; every value is shown, defaults
    included, so that :func:`load_config` of the text gives ``cfg`` again.
    """
    lines = ["# Every key of the config, with its help; docs/CONFIG.md is the reference."]
    for declared in settings_of(Config):
        value = getattr(cfg, declared.name)
        lines.append("")
        if dataclasses.is_dataclass(value):
            lines += [*_yaml_comment(declared, ""), f"{declared.name}:"]
            for inner in settings_of(type(value)):
                lines += _yaml_key(inner, getattr(value, inner.name), "  ")
        else:
            lines += _yaml_key(declared, value, "")
    return "\n".join(lines) + "\n"


def _yaml_key(declared: Setting, value: Any, indent: str) -> list[str]:
    """One key: its comment, then ``key: value`` (a list of sources: one mapping per item)."""
    lines = _yaml_comment(declared, indent)
    if not (isinstance(value, list) and value and dataclasses.is_dataclass(value[0])):
        return [*lines, f"{indent}{declared.name}: {_yaml_scalar(value)}"]
    lines.append(f"{indent}{declared.name}:  # the keys each source sets (SourceConfig)")
    for item in value:
        lines.append(f"{indent}  -")
        for inner in settings_of(type(item)):
            if getattr(item, inner.name) != inner.default:
                lines += _yaml_key(inner, getattr(item, inner.name), indent + "    ")
    return lines


def _yaml_comment(declared: Setting, indent: str) -> list[str]:
    """The help of a key, with its range or choices, as ``#`` lines of at most ~100 columns."""
    text = declared.help + allowed_values(declared, prefix="; allowed: ")
    width = max(40, 98 - len(indent))
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width)]


def _yaml_scalar(value: Any) -> str:
    """One value in YAML flow style, as :class:`_Loader` reads it back."""
    text = yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=1 << 30, allow_unicode=True
    )
    return text.removesuffix("\n").removesuffix("\n...")
