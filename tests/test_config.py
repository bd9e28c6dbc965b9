"""Config: YAML onto typed dataclasses, dotted overrides, errors that name the key."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_mt.config import (
    Config,
    config_from_dict,
    load_config,
    recipe_names,
    recipe_path,
)
from transformer_mt.errors import MTError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_overrides_are_typed():
    cfg = load_config(None, ["train.max_steps=7", "train.lr_factor=3", "model.pre_norm=true"])
    assert cfg.train.max_steps == 7
    assert cfg.train.lr_factor == 3.0 and isinstance(cfg.train.lr_factor, float)
    assert cfg.model.pre_norm is True


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("train.max_step=7", "train.max_step"),
        ("train.max_steps=seven", "train.max_steps"),
        ("train.max_steps=1.5", "train.max_steps"),
        ("model.pre_norm=3", "model.pre_norm"),
        ("trian.seed=1", "trian"),
        ("train.seed", "train.seed"),
    ],
)
def test_bad_override_names_the_key(override, named):
    with pytest.raises(MTError, match=re.escape(named)):
        load_config(None, [override])


def test_yaml_unknown_key_names_file_and_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 5\n  learning_rate: 1\n")
    with pytest.raises(MTError, match=r"c\.yaml.*train\.learning_rate"):
        load_config(path)


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(MTError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(MTError, match=r"config file not found: nope; .* recipe \(multi30k_de_en, "):
        load_config("nope")


def test_cross_field_validation():
    with pytest.raises(MTError, match="divisible"):
        load_config(None, ["model.d_model=30", "model.n_head=4"])
    with pytest.raises(MTError, match=r"tokenizer\.joint"):
        load_config(None, ["tokenizer.joint=false", "model.share_embeddings=true"])


def test_name_defaults_to_file_stem(tmp_path):
    path = tmp_path / "my_run.yaml"
    path.write_text("train:\n  seed: 3\n")
    assert load_config(path).name == "my_run"


def test_round_trip_through_dict():
    cfg = load_config(None, ["train.seed=9", "model.n_dec_layers=1"])
    assert config_from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_and_comment_every_key(path):
    load_config(path)
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r"^\s+\w+:\s*\S", line):
            assert "#" in line, f"{path.name}:{lineno} has no comment: {line.strip()}"


def test_every_dataclass_field_has_a_comment():
    source = (Path(__file__).resolve().parents[1] / "transformer_mt" / "config.py").read_text()
    sections = [s.type for s in dataclasses.fields(Config) if dataclasses.is_dataclass(s.type)]
    assert len(sections) == 5
    for cls in sections:
        for f in dataclasses.fields(cls):
            line = next(ln for ln in source.splitlines() if re.match(rf"\s+{f.name}: ", ln))
            assert "#" in line, f"config field {f.name} has no comment"


# --- the shipped recipes --------------------------------------------------------------------------


def test_configs_at_the_repository_root_are_the_packaged_recipes():
    assert (REPO / "configs").resolve() == (REPO / "transformer_mt" / "configs").resolve()
    assert recipe_names() == sorted(p.stem for p in CONFIGS)
    assert "toy" in recipe_names()


def test_a_recipe_name_loads_the_shipped_recipe_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("multi30k_de_en", ["train.seed=3"])
    assert cfg == load_config(REPO / "configs" / "multi30k_de_en.yaml", ["train.seed=3"])
    (tmp_path / "toy").write_text("train:\n  seed: 5\n")  # a file of that name wins
    assert load_config("toy").train.seed == 5 and load_config("toy").name == "toy"
    assert load_config(recipe_path()).train.warmup_steps == 200


_SHOW_DEFAULT = """
import json, sys, transformer_mt
from transformer_mt.cli import _load_config
from transformer_mt.config import load_config, recipe_path
print(json.dumps({"where": transformer_mt.__file__, "cli": _load_config(None, None).to_dict(),
                  "recipe": load_config(recipe_path()).to_dict()}))
"""


def test_an_installed_package_defaults_to_the_toy_recipe(tmp_path):
    """`pip install .` then `mt train` elsewhere: the toy recipe, not the dataclass defaults."""
    source = tmp_path / "source"  # a copy: building in the checkout would write build/ there
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "transformer_mt", source / "transformer_mt", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--target", str(site), str(source)]
    subprocess.run(pip, check=True, capture_output=True, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = subprocess.run(
        [sys.executable, "-c", _SHOW_DEFAULT],
        check=True, capture_output=True, text=True, cwd=elsewhere, env=env,
    )  # fmt: skip
    got = json.loads(shown.stdout)
    assert Path(got["where"]).is_relative_to(site)  # the installed copy, not this checkout
    toy = load_config(REPO / "configs" / "toy.yaml").to_dict()
    assert got["cli"] == got["recipe"] == toy
    assert (toy["name"], toy["train"]["warmup_steps"], toy["train"]["max_steps"]) == (
        "toy",
        200,
        600,
    )
