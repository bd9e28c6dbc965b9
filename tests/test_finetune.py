"""Fine-tuning (`mt train --init-from CKPT`): a new run from a trained model's weights, tokenizers
and shape, on new data, with a new optimizer and schedule."""

import hashlib
import json
import os
import re
import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_CONFIG
from typer.testing import CliRunner

from transformer_mt.checkpoint import save_checkpoint
from transformer_mt.cli import app
from transformer_mt.config import ModelConfig, load_config
from transformer_mt.data.prepare import prepare
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.data.toy import toy_splits
from transformer_mt.errors import MTError
from transformer_mt.training import init_from
from transformer_mt.training.schedule import noam_lr
from transformer_mt.training.trainer import Trainer

runner = CliRunner()
BASE_STEPS = 150
# Validation once, at the end, without decoding: these runs measure loss only.
FAST = ["train.valid_bleu=false", "train.best_metric=loss", "train.valid_every=1000"]


def _config(tmp_path: Path, steps: int, text: str = TINY_CONFIG) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text.format(cache=tmp_path / "cache", steps=steps))
    return path


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The last.pt of a tiny model trained on the toy corpus (shared: tests read it only)."""
    tmp = tmp_path_factory.mktemp("base")
    cfg = load_config(_config(tmp, BASE_STEPS), FAST)
    Trainer(cfg, tmp / "run", progress=False).run()
    return tmp / "run" / "last.pt"


def _shifted_corpus(tmp_path: Path) -> str:
    """TINY_CONFIG on another domain: toy pairs of another seed whose target sentences have their
    words in reverse order (the base model's pieces, another word order), as local files."""
    for split, pairs in toy_splits(400, 40, 20, seed=77).items():
        src = "".join(s + "\n" for s, _ in pairs)
        trg = "".join(" ".join(reversed(t.split())) + "\n" for _, t in pairs)
        (tmp_path / f"{split}.src").write_text(src)
        (tmp_path / f"{split}.trg").write_text(trg)
    files = "".join(
        f"  {split}_{side}: {tmp_path / f'{split}.{side}'}\n"
        for split in ("train", "valid", "test")
        for side in ("src", "trg")
    )
    return TINY_CONFIG.replace("  corpus: toy\n", "  corpus: local\n" + files)


def test_fine_tuning_beats_training_from_scratch_on_shifted_data(base, tmp_path):
    """The same steps on the same batches of the same tokens (both runs read one prepared data,
    encoded with the checkpoint's tokenizer): from the trained model the loss ends lower."""
    steps = 15
    config = _config(tmp_path, steps, _shifted_corpus(tmp_path))
    scratch_cfg, tuned_cfg = load_config(config, FAST), load_config(config, FAST)
    tuned_cfg.train.init_from = str(base)
    ckpt = _load(base)
    tokenizers = Tokenizer(ckpt["src_spm"]), Tokenizer(ckpt["trg_spm"])
    data = prepare(scratch_cfg, progress=False, tokenizers=tokenizers)
    Trainer(scratch_cfg, tmp_path / "scratch", progress=False, data=data).run()
    Trainer(tuned_cfg, tmp_path / "tuned", progress=False, data=data).run()

    scratch, tuned = _metrics(tmp_path / "scratch"), _metrics(tmp_path / "tuned")
    assert [r["step"] for r in tuned] == [r["step"] for r in scratch]
    train = {name: [r["loss"] for r in runs if "loss" in r] for name, runs in
             (("scratch", scratch), ("tuned", tuned))}  # fmt: skip
    assert len(train["tuned"]) == steps
    base_final = next(r["loss"] for r in reversed(_metrics(base.parent)) if "loss" in r)
    assert train["tuned"][0] > base_final, "the new corpus must be a shift for the base model"
    # Measured: training loss of the last 5 steps 4.47 against 4.76, validation 4.11 against 4.41
    # (the tiny model's capacity bounds both); the margins are half of that.
    assert train["tuned"][0] < train["scratch"][0] - 0.5, "the trained model transfers at once"
    last5 = {name: sum(losses[-5:]) / 5 for name, losses in train.items()}
    assert last5["tuned"] < last5["scratch"] - 0.15, last5
    val = {name: runs[-1]["val_loss"] for name, runs in (("scratch", scratch), ("tuned", tuned))}
    assert val["tuned"] < val["scratch"] - 0.15, val


def test_the_run_starts_from_the_checkpoints_weights_tokenizer_and_shape(base, tmp_path, caplog):
    # Another corpus and vocabulary size, and no shape keys: the data would train another
    # tokenizer and the defaults describe another model, but the checkpoint's are used.
    text = TINY_CONFIG.replace("  corpus: toy\n", "  corpus: toy\n  toy_seed: 7\n")
    model_section = text[text.index("model:\n") : text.index("train:\n")]
    text = text.replace(model_section, "model:\n  drop_prob: 0.3\n")
    text = text.replace("  vocab_size: 300\n", "  vocab_size: 200\n")
    cfg = load_config(_config(tmp_path, 5, text), FAST)
    assert cfg.model.d_model == ModelConfig().d_model != 32
    cfg.train.init_from = str(base)
    ckpt = _load(base)
    with caplog.at_level("INFO", logger="transformer_mt"):
        trainer = Trainer(cfg, tmp_path / "run", progress=False)
    try:
        weights = trainer.model.state_dict()
        assert weights.keys() == ckpt["model"].keys()
        assert all(torch.equal(weights[k], ckpt["model"][k]) for k in weights)
        assert trainer.data.src_tok.model_proto == ckpt["src_spm"]
        assert trainer.data.trg_tok.model_proto == ckpt["trg_spm"]
        assert trainer.model_args == {**ckpt["model_args"], "drop_prob": 0.3}
        assert trainer.cfg.model.d_model == 32 and trainer.cfg.tokenizer.vocab_size == 300
        assert trainer.state.step == 0 and not trainer.optimizer.state, "a new optimizer"
    finally:
        trainer.close()
    own = prepare(cfg, progress=False)  # what this config's data would have trained
    assert own.src_tok.model_proto != ckpt["src_spm"]
    tokenizer_notes = [r for r in caplog.records if "sets the tokenizer" in r.getMessage()]
    assert len(tokenizer_notes) == 1
    assert "tokenizer.vocab_size 200 -> 300" in tokenizer_notes[0].getMessage()


def test_mt_train_init_from_records_where_the_run_started(base, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--config", str(_config(tmp_path, 3)), "--run-dir", str(run),
            "--no-progress", "--init-from", str(base), *(x for s in FAST for x in ("--set", s))]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["init_from"] == str(base)
    record = {
        "path": str(base.resolve()),
        "sha256": hashlib.sha256(base.read_bytes()).hexdigest(),
        "step": BASE_STEPS,
    }
    for name in ("last.pt", "best.pt", "step_3.pt"):
        assert _load(run / name)["train_state"]["init_from"] == record, name
    assert (run / "spm.src.model").read_bytes() == _load(base)["src_spm"]
    # A new schedule: step 1's learning rate is the warm-up's first, not that of step 151.
    cfg = load_config(_config(tmp_path, 3))
    first = next(r for r in _metrics(run) if "loss" in r)
    assert first["step"] == 1
    assert first["lr"] == pytest.approx(noam_lr(1, 32, cfg.train.warmup_steps, 1.0))


def _with_lang_tags(base: Path, path: Path, tags: dict[str, str]) -> Path:
    ckpt = _load(base)
    ckpt["lang_tags"] = tags
    save_checkpoint(ckpt, path)
    return path


@pytest.mark.parametrize(
    "case", ["missing", "not-a-checkpoint", "shape", "two-shape-keys", "max-len", "language"]
)
def test_a_bad_start_is_one_line_before_any_data_is_prepared(base, tmp_path, case):
    config, sets, ckpt = _config(tmp_path, 3), [], base
    expected = {
        "missing": r"checkpoint not found: .*nope\.pt",
        "not-a-checkpoint": r"cannot load checkpoint .*junk\.pt",
        "shape": r"model\.d_model is 64 in the config but 32 in .*last\.pt; remove the model "
        r"section's shape keys .* or match them$",
        "two-shape-keys": r"model\.d_model is 64 in the config but 32, model\.n_layers is 2 in "
        r"the config but 1 in .*last\.pt",
        "max-len": r"data\.max_tokens_per_side=100 exceeds model\.max_len=64 of .*last\.pt",
        "language": r"tagged\.pt has no language tag for the target language 'trg' .*knows: "
        r"de, en",
    }[case]
    if case == "missing":
        ckpt = tmp_path / "nope.pt"
    elif case == "not-a-checkpoint":
        ckpt = tmp_path / "junk.pt"
        ckpt.write_bytes(os.urandom(1000))
    elif case in ("shape", "two-shape-keys"):
        sets = ["model.d_model=64"] + (["model.n_layers=2"] if case == "two-shape-keys" else [])
    elif case == "max-len":
        text = TINY_CONFIG.replace("  max_len: 64\n", "").replace(
            "max_tokens_per_side: 48", "max_tokens_per_side: 100"
        )
        config = _config(tmp_path, 3, text)
    elif case == "language":
        ckpt = _with_lang_tags(base, tmp_path / "tagged.pt", {"en": "<2en>", "de": "<2de>"})
    run = tmp_path / "run"
    args = ["train", "--config", str(config), "--run-dir", str(run), "--no-progress",
            "--init-from", str(ckpt), *(x for s in sets for x in ("--set", s))]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(expected, lines[0]), lines[0]
    assert not (tmp_path / "cache").exists(), "no data prepared"
    assert not run.exists(), "no run directory left behind"


def test_check_languages_needs_a_tag_that_is_one_piece(base):
    ckpt = _load(base)
    cfg = load_config(None)
    cfg.data.trg_lang = "en"
    init_from.check_languages(cfg, ckpt)  # no lang_tags: one language pair, nothing to check
    piece = Tokenizer(ckpt["trg_spm"]).id_to_piece([10])[0]
    init_from.check_languages(cfg, {**ckpt, "lang_tags": {"en": piece}})
    with pytest.raises(MTError, match=r"tag '<2en>' of language 'en' is not a piece"):
        init_from.check_languages(cfg, {**ckpt, "lang_tags": {"en": "<2en>"}})
    with pytest.raises(MTError, match=r"no language tag for the target language 'en'"):
        init_from.check_languages(cfg, {**ckpt, "lang_tags": {"de": piece}})


def test_check_shape_treats_defaults_as_unset_and_null_decoder_depth_as_the_encoders():
    saved = {"d_model": 32, "n_head": 2, "ffn_hidden": 64, "n_layers": 2, "n_dec_layers": None,
             "max_len": 64, "pre_norm": False, "tie_embeddings": True, "share_embeddings": True}  # fmt: skip
    init_from.check_shape(ModelConfig(), saved, Path("c.pt"))  # all defaults: the checkpoint's
    init_from.check_shape(ModelConfig(n_layers=2, n_dec_layers=2), saved, Path("c.pt"))
    with pytest.raises(MTError, match=r"model\.n_dec_layers is 3 in the config but null"):
        init_from.check_shape(ModelConfig(n_dec_layers=3), saved, Path("c.pt"))
    with pytest.raises(MTError, match=r"model\.pre_norm is true in the config but false"):
        init_from.check_shape(ModelConfig(pre_norm=True), saved, Path("c.pt"))


def test_an_interrupted_fine_tuning_run_resumes_from_its_own_checkpoint(
    base, tmp_path, monkeypatch, caplog
):
    start = tmp_path / "start.pt"  # removed after the first invocation: a resume never reads it
    piece = Tokenizer(_load(base)["trg_spm"]).id_to_piece([10])[0]
    _with_lang_tags(base, start, {"trg": piece})
    record = {"path": str(start.resolve()), "sha256": hashlib.sha256(start.read_bytes()).hexdigest(),
              "step": BASE_STEPS}  # fmt: skip
    cfg = load_config(_config(tmp_path, 8), FAST)
    cfg.train.init_from = str(start)
    real_step = Trainer.train_step

    def signalled(self, *args, **kwargs):
        if self.state.step == 1:  # SIGTERM during step 2: the run stops after step 3
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, *args, **kwargs)

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_step", signalled)
        assert Trainer(cfg, run, progress=False).run().step == 3
    start.unlink()
    with caplog.at_level("INFO", logger="transformer_mt"):
        assert Trainer(cfg, run, progress=False).run().step == 8
    assert "train.init_from is not read again: the run continues from" in caplog.text
    assert "resuming" in caplog.text and "at step 3" in caplog.text
    steps = [r["step"] for r in _metrics(run) if "loss" in r]
    assert steps == list(range(1, 9)), "one run: steps 4-8 continue steps 1-3"
    lrs = [r["lr"] for r in _metrics(run) if "loss" in r]
    assert lrs[3] == pytest.approx(noam_lr(4, 32, cfg.train.warmup_steps, 1.0))

    # The config without train.init_from (e.g. --init-from left out): still the same run.
    cfg.train.init_from, cfg.train.max_steps = None, 10
    assert Trainer(cfg, run, progress=False).run().step == 10
    last = _load(run / "last.pt")
    assert last["train_state"]["init_from"] == record
    assert last["lang_tags"] == {"trg": piece}, "the tags travel with the model"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["init_from"] == str(
        start.resolve()
    )


def test_an_ordinary_run_is_not_resumed_as_a_fine_tuning_run(base, tmp_path):
    cfg = load_config(_config(tmp_path, 2), FAST)
    Trainer(cfg, tmp_path / "run", progress=False).run()
    cfg.train.init_from, cfg.train.max_steps = str(base), 4
    with pytest.raises(
        MTError, match=r"last\.pt is a run that did not start from .* another --run-dir"
    ):
        Trainer(cfg, tmp_path / "run", progress=False)


def test_a_damaged_init_from_record_is_one_line(tmp_path):
    cfg = load_config(None)
    for record in ("runs/a/best.pt", {"path": "a.pt", "sha256": "ab", "step": "150"}):
        with pytest.raises(
            MTError, match=r"damaged checkpoint .*last\.pt: field train_state\.init_from"
        ):
            init_from.find_start(cfg, {"train_state": {"init_from": record}}, tmp_path / "last.pt")
