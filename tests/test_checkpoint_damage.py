"""Damaged checkpoints: weights that hold NaN/Inf, and metadata of the wrong type, are one-line
errors naming the file and the tensor or field, in every command that loads a checkpoint
(translate, export, average, the server's loader, a resume): never a traceback, never garbage
translated with exit 0; and no command or training run writes non-finite weights."""

import contextlib
import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from transformer_mt.checkpoint import (
    RUN_STATE,
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from transformer_mt.cli import app
from transformer_mt.config import load_config
from transformer_mt.errors import MTError
from transformer_mt.training.state import TrainState
from transformer_mt.training.trainer import Trainer

runner = CliRunner()
FAST = ["train.valid_bleu=false", "train.best_metric=loss", "train.max_steps=10"]
DELETE = object()  # a field taken out instead of replaced


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """last.pt of a tiny run of 10 steps: weights, model args, config, tokenizers and a train
    state with one validation in its history."""
    from conftest import TINY_CONFIG

    tmp = tmp_path_factory.mktemp("damage")
    config = tmp / "tiny.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp / "cache", steps=10))
    Trainer(load_config(config, FAST), tmp / "run", progress=False).run()
    return tmp / "run" / "last.pt"


@pytest.fixture
def base(trained) -> dict[str, Any]:
    return torch.load(trained, weights_only=True)


def _copy(value: Any) -> Any:
    """A copy of the containers of a checkpoint (tensors shared: nothing writes them)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _damaged(ckpt: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    """A copy of ``ckpt`` with the field at ``path`` replaced by ``value`` (or deleted)."""
    ckpt = _copy(ckpt)
    parent = ckpt
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return ckpt


def _one_error(result) -> str:
    """The single `error:` line of a command that failed as a user's mistake must."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def _commands(ckpt: Path, work: Path) -> dict[str, list[str]]:
    """The three commands that load a checkpoint, with outputs in ``work``."""
    (work / "in.txt").write_text("the dog runs\n", encoding="utf-8")
    return {
        "translate": ["translate", "-c", str(ckpt), "-i", str(work / "in.txt")],
        "export": ["export", "-c", str(ckpt), "-o", str(work / "exported")],
        "average": ["average", str(ckpt), "-o", str(work / "avg.pt")],
    }


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


# ------------------------------------------------------------------- weights that are not finite


@pytest.mark.parametrize(
    ("tensor", "value"), [("src_emb.weight", math.inf), ("encoder.0.ffn.fc1.weight", math.nan)]
)
def test_non_finite_weights_are_refused_by_every_command(base, tmp_path, tensor, value):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    weights = dict(base["model"])
    weights[tensor] = weights[tensor].clone()
    weights[tensor].view(-1)[3] = value
    ckpt = tmp_path / "bad.pt"
    torch.save({**base, "model": weights}, ckpt)  # torch.save: save_checkpoint would refuse
    before = _snapshot(tmp_path)
    for name, args in _commands(ckpt, tmp_path).items():
        line = _one_error(runner.invoke(app, args))
        assert f"damaged checkpoint {ckpt}: tensor {tensor} holds NaN/Inf" in line, name
    assert _snapshot(tmp_path) == {**before, "in.txt": b"the dog runs\n"}, "nothing written"


def test_average_never_writes_an_average_of_a_non_finite_input(base, trained, tmp_path):
    weights = {k: v.clone() for k, v in base["model"].items()}
    weights["out.weight"].fill_(math.nan)
    torch.save({**base, "model": weights}, tmp_path / "nan.pt")
    with pytest.raises(MTError, match=r"nan\.pt: tensor out\.weight holds NaN/Inf"):
        average_checkpoints([trained, tmp_path / "nan.pt"], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


def test_a_save_of_non_finite_weights_fails_and_keeps_the_file_there(base, tiny_config, tmp_path):
    """Training's one save function (RunDirectory.save -> save_checkpoint) refuses diverged
    weights: best.pt and last.pt keep their last finite weights, no step file appears."""
    from transformer_mt.training.run_dir import RunDirectory

    run = RunDirectory(tmp_path, load_config(tiny_config), is_main=True)
    run.save(base, step=10, best=True)
    before = _snapshot(tmp_path)
    weights = dict(base["model"])
    weights["out.weight"] = torch.full_like(weights["out.weight"], -math.inf)
    with pytest.raises(MTError, match=r"not writing .*best\.pt: tensor out\.weight holds NaN/Inf"):
        run.save({**base, "model": weights, "step": 20}, step=20, best=True)
    assert _snapshot(tmp_path) == before


# --------------------------------------------------------------------- metadata of a wrong type

CASES = {  # name: (field path, value, what the message names)
    "step a string": (("step",), "12", "field step is the string '12', expected an integer"),
    "step negative": (("step",), -1, "field step is the integer -1, expected an integer >= 0"),
    "history entry with null": (
        ("train_state", "state", "history", 0, "val_loss"),
        None,
        "field train_state.state.history[0].val_loss is null, expected a number",
    ),
    "train state a list": (("train_state",), [1, 2], "field train_state is a list of 2 item(s)"),
    "train state null": (("train_state",), None, "field train_state is null, expected a dict"),
    "run state null": (("train_state", "state"), None, "field train_state.state is null"),
    "config section a list": (("config", "decode"), [3], "field config.decode is a list"),
    "config section null": (("config", "train"), None, "field config.train is null"),
    "config a list": (("config",), [], "field config is a list of 0 item(s)"),
    "config value of another type": (
        ("config", "decode", "beam_size"),
        "wide",
        "config key 'decode.beam_size'",
    ),
    "model argument a string": (
        ("model_args", "d_model"),
        "32",
        "field model_args.d_model is the string '32', expected an integer >= 1",
    ),
    "model argument null": (("model_args", "n_head"), None, "field model_args.n_head is null"),
    "padding id past the vocabulary": (
        ("model_args", "src_pad_idx"),
        10**6,
        "field model_args.src_pad_idx is the integer 1000000, expected an integer in [0, enc_voc",
    ),
    "model argument missing": (("model_args", "enc_voc_size"), DELETE, "enc_voc_size is missing"),
    "averaged_from not names": (("averaged_from",), [1], "field averaged_from is a list"),
    "tokenizer not bytes": (("src_spm",), "spm", "field src_spm is the string 'spm'"),
    "fingerprint a list": (
        ("train_state", "data_fingerprint"),
        ["a"],
        "field train_state.data_fingerprint is a list",
    ),
    "generator state damaged": (
        ("train_state", "rng", "torch"),
        torch.zeros(3, dtype=torch.uint8),
        "field train_state.rng.torch is a tensor of shape (3,), expected torch's generator state",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_metadata_of_the_wrong_type_is_one_line_naming_the_field(base, tmp_path, case):
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    path, value, expected = CASES[case]
    ckpt = tmp_path / "bad.pt"
    torch.save(_damaged(base, path, value), ckpt)
    for name, args in _commands(ckpt, tmp_path).items():
        line = _one_error(runner.invoke(app, args))
        assert f"damaged checkpoint {ckpt}: " in line and expected in line, (name, line)
    assert not (tmp_path / "exported").exists() and not (tmp_path / "avg.pt").exists()


def test_a_resume_from_a_damaged_train_state_is_one_line(base, tiny_config, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save(_damaged(base, ("train_state", "state", "epoch"), 1.5), run / "last.pt")
    result = runner.invoke(
        app, ["train", "--config", str(tiny_config), "--run-dir", str(run), "--no-progress"]
    )
    assert "field train_state.state.epoch is the number 1.5, expected an integer" in (
        _one_error(result)
    )


def test_the_schema_of_the_run_state_is_train_states():
    """RUN_STATE (checkpoint.py, below training/ in the import order) lists TrainState's fields:
    a field added to one and not the other would refuse new checkpoints or pass bad ones."""
    assert list(RUN_STATE) == [f.name for f in dataclasses.fields(TrainState)]
    state = dataclasses.asdict(TrainState(best=1.0, best_metric="bleu", warmup_seconds=2.0))
    state["history"] = [{"step": 1, "val_loss": 2.0, "val_bleu": 3.5}]
    for key, (fits, _) in RUN_STATE.items():
        assert fits(state[key]), key


def test_older_and_averaged_checkpoints_fit_the_schema(trained, tmp_path):
    fixture = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint" / "old_last.pt"
    assert load_checkpoint(fixture)["step"] == 1500  # no train state, old parameter names
    average_checkpoints([trained], tmp_path / "avg.pt")
    averaged = load_checkpoint(tmp_path / "avg.pt")
    assert "train_state" not in averaged and averaged["averaged_from"] == [str(trained)]


def test_save_checkpoint_refuses_nan_before_writing(base, tmp_path):
    target = tmp_path / "x.pt"
    target.write_bytes(b"old")
    weights = dict(base["model"])
    weights["trg_emb.weight"] = weights["trg_emb.weight"] * math.nan
    with pytest.raises(MTError, match=r"tensor trg_emb\.weight holds NaN/Inf"):
        save_checkpoint({**base, "model": weights}, target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.pt"]


# ------------------------------------------------------------------ the property: never a crash

MODEL_ARGS = """src_pad_idx trg_sos_idx enc_voc_size dec_voc_size d_model n_head max_len
    ffn_hidden n_layers drop_prob n_dec_layers pre_norm tie_embeddings share_embeddings"""
FIELDS = [
    ("step",),
    ("averaged_from",),
    ("special_ids",),
    ("lang_tags",),
    ("src_spm",),
    ("model",),
    ("model", "src_emb.weight"),
    ("model", 7),  # a tensor (or anything) under a name that is not a string
    ("config",),
    ("config", "name"),
    ("config", "decode"),
    ("config", "decode", "beam_size"),
    ("config", "decode", "max_len_a"),
    ("config", "train"),
    ("config", "train", "seed"),
    ("config", "train", "valid_bleu_tokenize"),
    ("config", "data", "src_lang"),
    ("train_state",),
    ("train_state", "state"),
    ("train_state", "state", "step"),
    ("train_state", "state", "best"),
    ("train_state", "state", "history"),
    ("train_state", "state", "history", 0),
    ("train_state", "state", "history", 0, "step"),
    ("train_state", "state", "history", 0, "val_loss"),
    ("train_state", "optimizer"),
    ("train_state", "optimizer", "param_groups"),
    ("train_state", "rng"),
    ("train_state", "rng", "python"),
    ("train_state", "rng_per_rank"),
    ("train_state", "data_fingerprint"),
    ("train_state", "init_from"),
    ("model_args",),
    ("model_args", "an_unknown_argument"),
    *[("model_args", key) for key in MODEL_ARGS.split()],
]
# Values of every type a weights_only checkpoint can hold. Integers stay small: a model argument
# that is large and of the right type builds a model that large before its weights are compared.
SCALARS = [DELETE, None, True, False, 0, 1, -1, 2, 3, 64, 0.5, -0.0, math.inf, math.nan]
OTHERS = ["", "13a", "bleu", b"", b"\x00", [], {}, (), [0], {"a": 1}, {0: torch.zeros(1)}]
TENSORS = [torch.zeros(0), torch.ones(2, 2), torch.tensor([math.nan])]
VALUES = st.one_of(
    st.sampled_from(SCALARS + OTHERS + TENSORS),
    st.integers(-5, 400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.integers(-3, 3)), max_size=2),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), min_size=1, max_size=3))
def test_any_damage_to_the_metadata_works_or_is_one_line(trained, tmp_path, changes):
    """Fields replaced by values of any type (or removed): translate, export, average and the
    server's loader each work or fail with one `error:` line (MTError), never another exception."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra is not installed")
    from transformer_mt.engines.engine import load_engine

    ckpt = torch.load(trained, weights_only=True)
    for path, value in changes:
        # (an earlier change may have removed or replaced what this path runs through)
        with contextlib.suppress(KeyError, IndexError, TypeError):
            ckpt = _damaged(ckpt, path, value)
    work = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: tmp_path is shared
    damaged = work / "damaged.pt"
    torch.save(ckpt, damaged)
    for name, args in _commands(damaged, work).items():
        result = runner.invoke(app, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            name,
            changes,
            result.output,
        )
        if result.exit_code:
            _one_error(result)
    two = runner.invoke(app, ["average", str(trained), str(damaged), "-o", str(work / "two.pt")])
    if two.exit_code:
        _one_error(two)
    try:
        load_engine("torch", damaged).describe()  # what `mt serve` loads, and GET /v1/model
    except MTError as err:
        assert "\n" not in str(err)


def test_random_bytes_are_never_loaded_and_always_one_line(tmp_path):
    """Bytes that are no checkpoint (400 random files of a few sizes, fixed seed) are each an
    MTError naming the file: never an IndexError or KeyError from the unpickler's stack or
    memo, nor a RuntimeError about a magic number (each of these escaped before)."""
    rng = np.random.default_rng(20261126)
    junk = tmp_path / "junk.pt"
    for i in range(400):
        junk.write_bytes(rng.bytes((5000, 1000, 200, 30)[i % 4]))
        with pytest.raises(MTError, match=r"junk\.pt"):
            load_checkpoint(junk)
