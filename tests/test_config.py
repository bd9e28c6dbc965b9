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
    SourceConfig,
    config_from_dict,
    load_config,
    recipe_names,
    recipe_path,
    save_config,
    settings_of,
)
from transformer_mt.errors import MTError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_overrides_are_typed():
    cfg = load_config(None, ["train.max_steps=7", "train.lr_factor=3", "model.pre_norm=true"])
    assert cfg.train.max_steps == 7
    assert cfg.train.lr_factor == 3.0 and isinstance(cfg.train.lr_factor, float)
    assert cfg.model.pre_norm is True
    assert load_config(None, ["data.max_words=null"]).data.max_words is None  # no word limit


def test_a_wrongly_typed_value_is_named_on_one_line():
    """A value whose repr spans lines (a tensor from a damaged checkpoint's config) or is long
    is shown on one line, cut short, in the error."""
    import torch

    for bad in (torch.ones(2, 2), "x" * 500, [list(range(50))]):
        with pytest.raises(MTError) as err:
            config_from_dict({"decode": {"beam_size": bad}})
        message = str(err.value)
        assert "\n" not in message and len(message) < 200, message
        assert message.startswith("config key 'decode.beam_size': expected int, got "), message
    with pytest.raises(MTError, match=r"got tensor\(\[\[1\., 1\.\], \[1\., 1\.\]\]\)"):
        config_from_dict({"decode": {"beam_size": torch.ones(2, 2)}})


def test_values_read_as_yaml_1_2(tmp_path):
    """``1e-4`` is a number and ``no`` (Norwegian) is text, in a file and in --set, as YAML
    1.2 reads them (PyYAML's YAML 1.1 reads text and false)."""
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  trg_lang: no\n  src_lang: on\ntrain:\n  weight_decay: 1e-4\n")
    cfg = load_config(path, ["train.adam_eps=1e-8", "train.lr_factor=2E+0"])
    assert (cfg.data.src_lang, cfg.data.trg_lang) == ("on", "no")
    assert cfg.train.weight_decay == 1e-4 and cfg.train.adam_eps == 1e-8
    assert cfg.train.lr_factor == 2.0
    with pytest.raises(MTError, match=r"model\.pre_norm"):
        load_config(None, ["model.pre_norm=yes"])  # true or false only
    assert load_config(None, ["train.max_steps=010", "train.log_every=1_000"]).train.max_steps == 10
    # config.yaml reads back as written, text that looks like a number included
    cfg = load_config(None, ["data.src_lang='1e5'", "data.trg_lang='010'"])
    save_config(cfg, tmp_path / "run.yaml")
    again = load_config(tmp_path / "run.yaml")
    assert (again.data.src_lang, again.data.trg_lang) == ("1e5", "010")
    assert again.to_dict() == cfg.to_dict()


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


def test_a_tilde_in_a_data_path_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(None, ["data.cache_dir=~/cache", "data.download_dir=~/dl"])  # (~ alone: null)
    assert (cfg.data.cache_dir, cfg.data.download_dir) == (f"{tmp_path}/cache", f"{tmp_path}/dl")
    (tmp_path / "c.yaml").write_text("data: {corpus: local, train_src: ~/a.de, train_trg: b.en}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert (cfg.data.train_src, cfg.data.train_trg) == (f"{tmp_path}/a.de", "b.en")


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
from transformer_mt.cli import load_config as _load_config
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


# --- ranges: every numeric field, checked by load_config before any work --------------------------

# (override, the key and range the one-line error must name); one row per bound of every field.
BAD_VALUES = [
    ("data.toy_train_size=0", "data.toy_train_size is 0; it must be at least 1"),
    ("data.toy_valid_size=0", "data.toy_valid_size is 0; it must be at least 1"),
    ("data.toy_test_size=-1", "data.toy_test_size is -1; it must be at least 1"),
    ("data.max_words=0", "data.max_words is 0; it must be at least 1"),
    ("data.max_ratio=0.5", "data.max_ratio is 0.5; it must be at least 1 or null"),
    ("data.max_tokens_per_side=1", "data.max_tokens_per_side is 1; it must be at least 2"),
    ("data.base_url=ftp://host/", "data.base_url is 'ftp://host/'; it must be an http(s) URL"),
    ("tokenizer.vocab_size=4", "tokenizer.vocab_size is 4; it must be at least 16"),
    ("tokenizer.character_coverage=0", "tokenizer.character_coverage is 0; it must be in (0, 1]"),
    ("tokenizer.character_coverage=1.5", "character_coverage is 1.5; it must be in (0, 1]"),
    ("tokenizer.sample_alpha=-0.1", "tokenizer.sample_alpha is -0.1; it must be at least 0"),
    ("tokenizer.sample_nbest=-2", "tokenizer.sample_nbest is -2; it must be at least -1"),
    ("tokenizer.sample_nbest=1", "tokenizer.sample_nbest=1: expected -1 (all) or at least 2"),
    ("tokenizer.sample_draws=0", "tokenizer.sample_draws is 0; it must be at least 1"),
    ("model.d_model=0", "model.d_model is 0; it must be at least 1"),
    ("model.n_head=0", "model.n_head is 0; it must be at least 1"),
    ("model.n_head=-4", "model.n_head is -4; it must be at least 1"),
    ("model.ffn_hidden=0", "model.ffn_hidden is 0; it must be at least 1"),
    ("model.n_layers=0", "model.n_layers is 0; it must be at least 1"),
    ("model.n_dec_layers=0", "model.n_dec_layers is 0; it must be at least 1 or null"),
    ("model.drop_prob=1", "model.drop_prob is 1; it must be in [0, 1)"),
    ("model.attn_drop_prob=-0.1", "model.attn_drop_prob is -0.1; it must be in [0, 1)"),
    ("model.ffn_drop_prob=1.5", "model.ffn_drop_prob is 1.5; it must be in [0, 1)"),
    ("model.max_len=1", "model.max_len is 1; it must be at least 2"),
    ("train.seed=-1", "train.seed is -1; it must be 0 to 9223372036854775807"),
    ("train.max_steps=0", "train.max_steps is 0; it must be at least 1"),
    ("train.batch_tokens=0", "train.batch_tokens is 0; it must be at least 1"),
    ("train.accum_steps=0", "train.accum_steps is 0; it must be at least 1"),
    ("train.lr_factor=0", "train.lr_factor is 0; it must be greater than 0"),
    ("train.lr_factor=.nan", "train.lr_factor is nan; it must be finite and greater than 0"),
    ("train.warmup_steps=0", "train.warmup_steps is 0; it must be at least 1"),
    ("train.adam_beta1=1", "train.adam_beta1 is 1; it must be in [0, 1)"),
    ("train.adam_beta2=-0.5", "train.adam_beta2 is -0.5; it must be in [0, 1)"),
    ("train.adam_eps=0", "train.adam_eps is 0; it must be greater than 0"),
    ("train.weight_decay=-1", "train.weight_decay is -1; it must be at least 0"),
    ("train.label_smoothing=1", "train.label_smoothing is 1; it must be in [0, 1)"),
    ("train.clip_norm=-1", "train.clip_norm is -1; it must be at least 0"),
    ("train.log_every=0", "train.log_every is 0; it must be at least 1"),
    ("train.valid_every=0", "train.valid_every is 0; it must be at least 1"),
    ("train.patience=-1", "train.patience is -1; it must be at least 0"),
    ("train.max_minutes=-1", "train.max_minutes is -1; it must be at least 0"),
    ("train.max_minutes=.inf", "train.max_minutes is inf; it must be finite and at least 0"),
    ("train.max_nonfinite=0", "train.max_nonfinite is 0; it must be at least 1"),
    ("train.keep_last=-1", "train.keep_last is -1; it must be at least 0"),
    ("train.average_last=-1", "train.average_last is -1; it must be at least 0"),
    ("train.threads=-2", "train.threads is -2; it must be at least 0"),
    ("train.device=gpu", "train.device is 'gpu'; it must be auto, cpu, cuda, cuda:N or mps"),
    ("train.device=cuda:x", "train.device is 'cuda:x'; it must be auto, cpu, cuda, cuda:N or mps"),
    ("decode.beam_size=0", "decode.beam_size (--beam) is 0; it must be 1 to 128"),
    ("decode.beam_size=100000", "decode.beam_size (--beam) is 100000; it must be 1 to 128"),
    ("decode.nbest=0", "decode.nbest (--nbest) is 0; it must be at least 1"),
    ("decode.nbest=5", "decode.nbest (--nbest) is 5; it must be between 1 and the beam size (4)"),
    ("decode.len_penalty=-1", "decode.len_penalty (--len-penalty) is -1; it must be at least 0"),
    ("decode.max_len_a=-1", "decode.max_len_a is -1; it must be at least 0"),
    ("decode.max_len_b=.inf", "decode.max_len_b is inf; it must be finite and at least 0"),
    ("decode.batch_tokens=0", "decode.batch_tokens (--batch-tokens) is 0; it must be at least 1"),
    ("decode.temperature=0", "decode.temperature (--temperature) is 0; it must be greater than 0"),
    ("decode.top_k=-1", "decode.top_k (--top-k) is -1; it must be at least 0"),
    ("decode.top_p=0", "decode.top_p (--top-p) is 0; it must be in (0, 1]"),
    ("decode.sample_seed=-9223372036854775809", "decode.sample_seed (--seed) is -922"),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES, ids=[r[0] for r in BAD_VALUES])
def test_each_numeric_key_is_range_checked(override, message):
    with pytest.raises(MTError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override",
    [
        "model.n_dec_layers=null",
        "data.max_ratio=null",
        "train.device=cuda:1",  # a name is checked here; a missing GPU when training starts
        "train.keep_last=0",
        "train.max_minutes=0.5",
        "train.threads=0",
        "data.toy_seed=-5",  # any integer seeds random.Random
        "decode.sample_seed=-1",
        "tokenizer.character_coverage=1",
        "data.base_url=http://127.0.0.1:8000/mirror/",
    ],
)
def test_edges_of_the_ranges_are_accepted(override):
    load_config(None, [override])


def _declared_classes() -> dict[str, type]:
    sections = {s.name: s.type for s in settings_of(Config) if dataclasses.is_dataclass(s.type)}
    return {"": Config, **sections, "data.train[]": SourceConfig}


def test_every_field_is_declared_with_help_and_numbers_with_a_range():
    """Each field of each config dataclass says what it does, and a numeric one what it
    accepts: validation, the options' help, `mt config` and docs/CONFIG.md read it from there."""
    for section, cls in _declared_classes().items():
        for declared in settings_of(cls):
            key = f"{section}.{declared.name}".lstrip(".")
            assert declared.help.strip(), f"{key} has no help"
            numeric = any(t in str(declared.type) for t in ("int", "float"))
            if numeric and "list" not in str(declared.type):
                assert declared.range is not None, f"{key} has no range"
                assert declared.range.holds(declared.default), f"{key}: default out of its range"
            if declared.choices is not None:
                assert declared.default in declared.choices, f"{key}: default not a choice"


def test_a_declared_range_is_what_validation_enforces():
    """Every declared bound is enforced by load_config, with the range's words in the error:
    one value beyond each finite bound is refused."""
    for section in ("data", "tokenizer", "model", "train", "decode"):
        for declared in settings_of(getattr(Config(), section).__class__):
            allowed = declared.range
            if allowed is None or declared.type not in (int, float, int | None, float | None):
                continue
            step = 1 if declared.type in (int, int | None) else 1e-6
            bounds = [(allowed.lo, -step), (allowed.hi, step)]
            for bound, delta in bounds:
                if bound is None:
                    continue
                value = (
                    bound if (allowed.lo_open if delta < 0 else allowed.hi_open) else bound + delta
                )
                override = f"{section}.{declared.name}={value}"
                with pytest.raises(MTError, match=re.escape(allowed.describe())):
                    load_config(None, [override])


def test_a_range_error_stops_train_before_any_data_work(tmp_path, monkeypatch):
    """`mt train --set model.n_head=0`: one error line, nothing prepared, no run directory."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    args = ["train", "--set", "model.n_head=0", "--set", f"data.cache_dir={cache}"]
    result = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.output.strip() == "error: model.n_head is 0; it must be at least 1"
    assert list(tmp_path.iterdir()) == []  # no cache, no run directory


def test_translate_refuses_a_huge_beam_before_translating():
    """`--beam 100000` grew to 23 GB before; now the settings are refused, nothing is decoded."""
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    ckpt = REPO / "tests" / "fixtures" / "old_checkpoint" / "old_last.pt"
    args = ["translate", "-c", str(ckpt), "--beam", "100000"]
    result = CliRunner().invoke(app, args, input="ein Satz .\n")
    assert result.exit_code == 1
    assert (
        result.output.strip() == "error: decode.beam_size (--beam) is 100000; it must be 1 to 128"
    )


# Each shared decode setting at values inside, at and beyond its declared range and the
# server's max_beam (6 below): (field, value, the other settings that keep the rest valid).
SHARED_DECODE_CASES = [
    ("beam_size", 0, {}),
    ("beam_size", 1, {}),
    ("beam_size", 6, {}),
    ("beam_size", 7, {}),
    ("beam_size", 129, {}),
    ("nbest", 0, {"beam_size": 6}),
    ("nbest", 1, {"beam_size": 6}),
    ("nbest", 6, {"beam_size": 6}),
    ("nbest", 7, {"beam_size": 6}),
    ("nbest", 7, {"beam_size": 7}),
    ("len_penalty", -1.0, {}),
    ("len_penalty", 0.0, {}),
    ("len_penalty", 0.6, {}),
    ("len_penalty", 50.0, {}),
]
CLI_OPTIONS = {"beam_size": "--beam", "nbest": "--nbest", "len_penalty": "--len-penalty"}
V1_FIELDS = {"beam_size": "beam", "nbest": "nbest", "len_penalty": "len_penalty"}


def _cli_answer(ckpt: Path, settings: dict, tmp_path: Path) -> tuple[bool, str]:
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    source = tmp_path / "in.txt"
    source.write_text("ein Hund\n", encoding="utf-8")
    args = ["translate", "-c", str(ckpt), "-i", str(source), "-o", str(tmp_path / "out.txt")]
    for key, value in settings.items():
        args += [CLI_OPTIONS[key], str(value)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code == 0, result.output.strip()


def test_the_cli_and_both_server_apis_accept_and_refuse_the_same_decode_values(tmp_path):
    """One override path: `mt translate`, POST /v1/translate and LibreTranslate's /translate
    accept the same values of each shared decode setting, and refuse with the same words; the
    server refuses more only where its max_beam is tighter, and its error names max_beam."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
    from test_serve import running

    from transformer_mt.engines.torch_engine import TorchEngine
    from transformer_mt.serve.app import Limits, create_app
    from transformer_mt.serve.batcher import BatchSettings

    ckpt = REPO / "tests" / "fixtures" / "old_checkpoint" / "old_last.pt"
    app = create_app(TorchEngine(ckpt), Limits(max_beam=6), BatchSettings())
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        for key, value, others in SHARED_DECODE_CASES:
            settings = {**others, key: value}
            cli_ok, cli_says = _cli_answer(ckpt, settings, tmp_path)
            body = {"text": ["ein Hund"], **{V1_FIELDS[k]: v for k, v in settings.items()}}
            v1 = client.post("/v1/translate", json=body)
            answers = [("/v1/translate", v1.status_code == 200, v1.json().get("error", ""))]
            if key == "nbest" and value >= 1:  # alternatives = n-best - 1; its beam follows
                body = {
                    "q": "ein Hund",
                    "source": "src",
                    "target": "trg",
                    "alternatives": value - 1,
                }
                libre = client.post("/translate", json=body)
                said = libre.json().get("error")  # LibreTranslate's words, ours in "detail"
                if "detail" in libre.json():
                    said = f"{said} ({libre.json()['detail']})"
                answers.append(("/translate", libre.status_code == 200, said))
            for route, ok, says in answers:
                case = f"{key}={value} ({others}): cli {cli_says!r}, {route} {says!r}"
                if cli_ok and not ok:
                    assert "max_beam" in says, case  # only the server's own, named limit
                    continue
                assert ok == cli_ok, case
                if not ok and "max_beam" not in says:  # the same words after the key's name
                    assert says.split(" is ", 1)[1] == cli_says.split(" is ", 1)[1], case
