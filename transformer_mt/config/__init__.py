"""Typed configuration: dataclasses, YAML loading, dotted overrides and validation.

A YAML file has one mapping per section (``data``, ``tokenizer``, ``model``, ``train``, ``decode``).
Every key must be a field of that section's dataclass and have its type; ``--set train.max_steps=100``
overrides one field. Mistakes raise :class:`MTError` naming the key, before any work starts.

By concern, each importing only those before it: ``settings`` (how a field is declared with
:func:`setting`, read back and checked against its range or choices; no section of its own),
``schema`` (the section dataclasses and the constants they share), ``validation`` (the checks of
a whole config and of the decode settings), ``files`` (YAML files, shipped recipes, ``--set``
overrides, checkpoint dicts in; YAML out). Every public name is re-exported here: import from
``transformer_mt.config``.
"""

from transformer_mt.config.files import (
    DEFAULT_RECIPE,
    apply_override,
    apply_overrides,
    config_from_dict,
    config_yaml,
    find_config,
    load_config,
    recipe_names,
    recipe_path,
    save_config,
)
from transformer_mt.config.schema import (
    BLEU_TOKENIZERS,
    LOCAL_FILE_KEYS,
    MAX_BEAM,
    MAX_SOURCE_WEIGHT,
    MIN_VOCAB_SIZE,
    SOURCE_KINDS,
    SPLITS,
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    SourceConfig,
    TokenizerConfig,
    TrainConfig,
    option_help,
)
from transformer_mt.config.settings import (
    ANY_NUMBER,
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    PROBABILITY,
    SEED_63,
    Limit,
    Range,
    Setting,
    allowed_values,
    check_settings,
    declared_settings,
    setting,
    setting_name,
    settings_of,
)
from transformer_mt.config.validation import (
    DEVICE_NAMES,
    check_device_name,
    check_language,
    check_plain_name,
    validate,
    validate_decode,
)

__all__ = [
    "ANY_NUMBER",
    "AT_LEAST_0",
    "AT_LEAST_1",
    "BLEU_TOKENIZERS",
    "DEFAULT_RECIPE",
    "DEVICE_NAMES",
    "LOCAL_FILE_KEYS",
    "MAX_BEAM",
    "MAX_SOURCE_WEIGHT",
    "MIN_VOCAB_SIZE",
    "POSITIVE",
    "PROBABILITY",
    "SEED_63",
    "SOURCE_KINDS",
    "SPLITS",
    "Config",
    "DataConfig",
    "DecodeConfig",
    "Limit",
    "ModelConfig",
    "Range",
    "Setting",
    "SourceConfig",
    "TokenizerConfig",
    "TrainConfig",
    "allowed_values",
    "apply_override",
    "apply_overrides",
    "check_device_name",
    "check_language",
    "check_plain_name",
    "check_settings",
    "config_from_dict",
    "config_yaml",
    "declared_settings",
    "find_config",
    "load_config",
    "option_help",
    "recipe_names",
    "recipe_path",
    "save_config",
    "setting",
    "setting_name",
    "settings_of",
    "validate",
    "validate_decode",
]
