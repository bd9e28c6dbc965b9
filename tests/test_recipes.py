"""End-to-end promises of the shipped recipes (slow: `make test-slow`)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from transformer_mt.cli import app

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.slow
def test_toy_recipe_reaches_bleu_90_on_the_test_split(tmp_path):
    """What `make train` promises: the quickstart model scores BLEU >= 90 (beam 4) on test."""
    runner = CliRunner()
    cache = tmp_path / "cache"
    trained = runner.invoke(
        app,
        ["train", "--config", str(CONFIGS / "toy.yaml"), "--run-dir", str(tmp_path / "run"),
         "--set", f"data.cache_dir={cache}", "--no-progress"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    (data,) = cache.glob("toy-v*-seed*")  # the generated text (not the binarized toy-train/)
    scored = runner.invoke(
        app,
        ["evaluate", "-c", str(tmp_path / "run" / "best.pt"), "--src", str(data / "test.src"),
         "--ref", str(data / "test.trg"), "--json"],
    )  # fmt: skip
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.stdout)["bleu"] >= 90.0
