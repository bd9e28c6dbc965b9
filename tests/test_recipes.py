"""End-to-end promises of the shipped recipes (slow: `make test-slow`), and what `make train` reads."""

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
        [
            *("train", "--config", str(CONFIGS / "toy.yaml"), "--run-dir", str(tmp_path / "run")),
            *("--set", f"data.cache_dir={cache}", "--no-progress"),
        ],
    )
    assert trained.exit_code == 0, trained.output
    (data,) = cache.glob("toy-v*-seed*")  # the generated text (not the binarized toy-train/)
    scored = runner.invoke(
        app,
        [
            *("evaluate", "-c", str(tmp_path / "run" / "best.pt")),
            *("--src", str(data / "test.src"), "--ref", str(data / "test.trg"), "--json"),
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.stdout)["bleu"] >= 90.0


def test_make_train_reads_the_test_split_the_toy_recipe_writes(tmp_path):
    """The Makefile names the toy test files by path: the path the toy recipe writes them to."""
    from transformer_mt.config import load_config
    from transformer_mt.data.sources import corpus_files

    makefile = (CONFIGS.parent / "Makefile").read_text()
    (named,) = [
        line.split(":=")[1].strip()
        for line in makefile.splitlines()
        if line.startswith("TOY_TEST :=")
    ]
    cfg = load_config(CONFIGS / "toy.yaml", [f"data.cache_dir={tmp_path}"])
    src, _ = corpus_files(cfg)["test"]
    assert src.parent.name == Path(named).parent.name
