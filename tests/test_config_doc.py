"""What is derived from the config's declarations: docs/CONFIG.md, `mt config` and the decode
options' help."""

import importlib.util
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.config import (
    Config,
    load_config,
    option_help,
    recipe_names,
    recipe_path,
    settings_of,
)

REPO = Path(__file__).resolve().parents[1]


def _config_doc_script():
    spec = importlib.util.spec_from_file_location("config_doc", REPO / "scripts" / "config_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_md_is_what_the_declarations_generate():
    """docs/CONFIG.md is current: a setting added, renamed or re-ranged without rerunning
    `python scripts/config_doc.py` fails here."""
    script = _config_doc_script()
    current = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert current == script.render(), "docs/CONFIG.md is out of date: python scripts/config_doc.py"


def test_config_md_lists_every_key_with_its_default_and_range():
    text = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for section in ("data", "tokenizer", "model", "train", "decode"):
        for declared in settings_of(type(getattr(Config(), section))):
            rows = [
                row for row in text.splitlines() if row.startswith(f"| `{section}.{declared.name}`")
            ]
            assert len(rows) == 1, f"{section}.{declared.name} is not listed once"
            if declared.range is not None:
                assert f"| {declared.range.describe()} |" in rows[0], rows[0]


@pytest.mark.parametrize("recipe", recipe_names())
def test_mt_config_prints_what_mt_train_runs_and_it_loads_back(recipe, tmp_path):
    """The printed YAML is a config: loaded, it is the very config `mt train` resolves from the
    same recipe and --set overrides."""
    overrides = ["train.max_steps=7", "decode.len_penalty=0.6"]
    result = CliRunner().invoke(
        app, ["config", recipe, "--set", overrides[0], "--set", overrides[1]]
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "printed.yaml"
    path.write_text(result.output, encoding="utf-8")
    assert load_config(path) == load_config(recipe_path(recipe), overrides)


def test_mt_config_comments_every_key_with_its_help():
    out = CliRunner().invoke(app, ["config"]).output
    lines = out.splitlines()
    for section in ("data", "tokenizer", "model", "train", "decode"):
        start = lines.index(f"{section}:")
        for declared in settings_of(type(getattr(Config(), section))):
            at = next(
                i for i in range(start, len(lines)) if lines[i].startswith(f"  {declared.name}:")
            )
            if not declared.help:
                continue  # a field still declared without setting() (test_config's PENDING)
            comment = []
            for line in reversed(lines[start:at]):
                if not line.startswith("  # "):
                    break
                comment.insert(0, line.removeprefix("  # "))
            assert " ".join(comment).startswith(declared.help[:40]), declared.name


@pytest.mark.parametrize(
    "bad", ["train.max_stepz=5", "model.n_head=0", "train.lr_schedule=cosine", "decode.nbest=9"]
)
def test_mt_config_refuses_what_mt_train_refuses_with_the_same_line(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `mt train` would make its run directory here
    shown = CliRunner().invoke(app, ["config", "--set", bad])
    trained = CliRunner().invoke(app, ["train", "--set", bad])
    assert shown.exit_code == trained.exit_code == 1
    assert shown.output == trained.output and shown.output.startswith("error: ")
    assert len(shown.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_decode_options_take_their_help_and_range_from_the_declaration():
    """`mt translate --beam`'s help is DecodeConfig.beam_size's help and range: changing the
    declaration changes the option."""
    command = typer.main.get_command(app).commands["translate"]
    helps = {param.opts[0]: param.help for param in command.params}
    for option, key in [
        ("--beam", "beam_size"),
        ("--len-penalty", "len_penalty"),
        ("--top-p", "top_p"),
    ]:
        assert helps[option] == option_help(key)
    assert "1 to 128" in helps["--beam"]
