"""Training: exact formulas, atomic checkpoints, non-finite losses, exact resume after SIGKILL."""

import itertools
import json
import math
import os
import platform
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer_mt import checkpoint as ckpt_mod
from transformer_mt.config import load_config
from transformer_mt.errors import MTError
from transformer_mt.host_memory import (
    bound_kernel_caches,
    keep_freed_memory,
    release_freed_memory,
    resident_mib,
)
from transformer_mt.training import loss as loss_mod
from transformer_mt.training import trainer as trainer_mod
from transformer_mt.training.loss import label_smoothed_nll, linear_label_smoothed_nll
from transformer_mt.training.metrics import MetricsWindow
from transformer_mt.training.schedule import budget_left, linear_decay_lr, noam_lr
from transformer_mt.training.trainer import StepResult, StopReason, Trainer


def test_noam_matches_hand_computed_values():
    # d_model 512, warmup 4000: 512^-0.5 = 0.0441942; peak at step 4000 = 0.0441942 * 4000^-0.5.
    assert noam_lr(1, 512, 4000) == pytest.approx(1.7469281e-7, rel=1e-6)
    assert noam_lr(4000, 512, 4000) == pytest.approx(6.9877124e-4, rel=1e-6)
    assert noam_lr(16000, 512, 4000) == pytest.approx(3.4938562e-4, rel=1e-6)
    assert noam_lr(100, 256, 400, factor=2.0) == pytest.approx(2 * 256**-0.5 * 100 * 400**-1.5)
    with pytest.raises(ValueError):
        noam_lr(0, 512, 4000)


def test_budget_left_is_the_smaller_of_the_step_and_time_fractions():
    # 100 steps, warm-up 20: steps 21..100 decay; step 21 has all 80 left, step 100 1/80.
    assert budget_left(21, 100, 20) == 1.0
    assert budget_left(61, 100, 20) == pytest.approx(40 / 80)
    assert budget_left(100, 100, 20) == pytest.approx(1 / 80)
    # A 600 s budget, warm-up over at 100 s: 350 s spent leaves half of the 500 s that decay.
    assert budget_left(30, 100, 20, 350.0, 600.0, 100.0) == pytest.approx(0.5)
    # ... unless the steps run out sooner.
    assert budget_left(90, 100, 20, 350.0, 600.0, 100.0) == pytest.approx(11 / 80)
    assert budget_left(30, 100, 20, 700.0, 600.0, 100.0) == 0.0, "past the budget: 0, not negative"
    assert budget_left(30, 100, 20, 350.0, 600.0, None) == pytest.approx(71 / 80), "no time yet"


def test_linear_decay_warms_up_as_noam_then_falls_to_zero():
    peak = noam_lr(20, 256, 20, 0.7)
    assert [linear_decay_lr(s, 256, 20, 0.7, 0.123) for s in (1, 10, 20)] == [
        noam_lr(s, 256, 20, 0.7) for s in (1, 10, 20)
    ], "warm-up ignores the budget"
    assert linear_decay_lr(21, 256, 20, 0.7, 1.0) == peak
    assert linear_decay_lr(50, 256, 20, 0.7, 0.25) == pytest.approx(peak / 4)
    assert linear_decay_lr(50, 256, 20, 0.7, 0.0) == 0.0


def test_linear_schedule_in_training_decays_in_a_straight_line(tiny_config, tmp_path):
    cfg = load_config(tiny_config, ["train.lr_schedule=linear", "train.max_steps=30"])
    Trainer(cfg, tmp_path / "run", progress=False).run()
    lrs = [r["lr"] for r in _metrics(tmp_path / "run") if "lr" in r]
    peak = noam_lr(10, 32, 10)
    assert lrs[:10] == pytest.approx([noam_lr(s, 32, 10) for s in range(1, 11)])
    # Steps 11..30 take peak * (31 - s) / 20: equal steps down to peak / 20 at the last one.
    assert lrs[10:] == pytest.approx([peak * (31 - s) / 20 for s in range(11, 31)])


def test_linear_schedule_with_a_time_budget_reaches_zero_when_time_is_up(tiny_config, tmp_path):
    sets = ["train.lr_schedule=linear", "train.max_steps=100000", "train.warmup_steps=2"]
    cfg = load_config(tiny_config, [*sets, "train.max_minutes=0.01", "train.valid_every=100000"])
    state = Trainer(cfg, tmp_path / "run", progress=False).run()
    lrs = [r["lr"] for r in _metrics(tmp_path / "run") if "lr" in r]
    assert len(lrs) == state.step > 3, "the time budget, not max_steps, ended the run"
    assert state.warmup_seconds is not None and 0 < state.warmup_seconds < 0.6
    decay = lrs[2:]
    assert decay[0] == noam_lr(2, 32, 2), "the first step after warm-up keeps the peak"
    assert all(a > b for a, b in itertools.pairwise(decay)), "falls with the clock"
    assert decay[-1] == 0.0, "the step that finds the budget spent has nothing left"


def test_an_unknown_lr_schedule_is_a_config_error(tiny_config):
    with pytest.raises(MTError, match=r"train\.lr_schedule='cosine'"):
        load_config(tiny_config, ["train.lr_schedule=cosine"])


def test_label_smoothing_matches_a_worked_example():
    # Probabilities (0.1, 0.2, 0.3, 0.4), target class 3, epsilon 0.1:
    #   nll = -ln 0.4 = 0.916291; mean_j -ln p_j = (2.302585 + 1.609438 + 1.203973 + 0.916291) / 4
    #   = 1.508072; loss = 0.9 * 0.916291 + 0.1 * 1.508072 = 0.975469. A pad position adds 0.
    logits = torch.log(torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]]))
    target = torch.tensor([[3, 0]])  # the second position is padding (pad id 0)
    loss, nll = label_smoothed_nll(logits, target, pad_idx=0, epsilon=0.1)
    assert loss.item() == pytest.approx(0.975469, abs=1e-5)
    assert nll.item() == pytest.approx(0.916291, abs=1e-5)
    plain, _ = label_smoothed_nll(logits, target, pad_idx=0, epsilon=0.0)
    assert plain.item() == pytest.approx(0.916291, abs=1e-5)


def test_checkpoint_cut_off_mid_write_keeps_the_last_good_one(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt_mod.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.torch, "save", broken_save)
    with pytest.raises(OSError):
        ckpt_mod.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"], "no temporary file left behind"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_directory_contents(tiny_config, tmp_path):
    cfg = load_config(tiny_config)
    state = Trainer(cfg, tmp_path / "run", progress=False).run()
    assert state.step == 20
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"last.pt", "best.pt", "config.yaml", "metrics.jsonl", "step_20.pt"} <= names
    assert "step_10.pt" not in names, "keep_last: 1 keeps only the newest step checkpoint"
    lines = _metrics(tmp_path / "run")
    train_lines = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, 21))
    assert [r["step"] for r in lines if "val_bleu" in r] == [10, 20]
    assert all(r["rss_mib"] > 50 for r in lines if "val_bleu" in r), "CPU validations log RSS"
    assert train_lines[-1]["loss"] < train_lines[0]["loss"]
    loaded = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert loaded["step"] == 20 and isinstance(loaded["src_spm"], bytes)


def test_metrics_window_averages_per_token_and_leaves_out_paused_time():
    # Three steps of 100, 300 and 200 tokens over 6 s of clock, 2 s of which validated.
    window = MetricsWindow(started=10.0)
    window.add(loss=250.0, nll=200.0, tokens=100.0, grad_norm=1.0)
    window.add(loss=690.0, nll=600.0, tokens=300.0, grad_norm=3.0)
    window.pause(2.0)
    window.add(loss=460.0, nll=400.0, tokens=200.0, grad_norm=float("inf"))  # fp16 overflow
    summary = window.summary(now=16.0)
    assert summary["loss"] == pytest.approx(1400 / 600) and summary["nll"] == pytest.approx(2.0)
    assert summary["grad_norm"] == 2.0, "the mean over the steps that had a finite norm"
    assert summary["tokens_per_s"] == pytest.approx(600 / 4), "validation time is not training"
    # Without the pause, the same window would claim 100 tokens/s.
    unpaused = MetricsWindow(started=10.0)
    unpaused.add(loss=1.0, nll=1.0, tokens=600.0, grad_norm=0.0)
    assert unpaused.summary(now=16.0)["tokens_per_s"] == pytest.approx(100.0)


def test_a_validation_inside_a_log_window_is_paused_in_training(tiny_config, tmp_path, monkeypatch):
    # The trainer's side of the contract: whatever a validation costs, the window pauses it.
    pauses: list[float] = []
    real_pause = MetricsWindow.pause

    def spy(self, seconds):
        pauses.append(seconds)
        real_pause(self, seconds)

    monkeypatch.setattr(MetricsWindow, "pause", spy)
    cfg = load_config(tiny_config, ["train.max_steps=12", "train.log_every=4",
                                    "train.valid_every=6", "train.valid_bleu=false",
                                    "train.best_metric=loss"])  # fmt: skip
    Trainer(cfg, tmp_path / "run", progress=False).run()
    logged = [r["step"] for r in _metrics(tmp_path / "run") if "tokens_per_s" in r]
    assert logged == [4, 8, 12] and len(pauses) == 2 and all(p > 0 for p in pauses)


@pytest.mark.parametrize("ending", ["max_steps", "time_up", "early_stop", "signal"])
def test_every_ending_leaves_the_loop_through_one_exit(tiny_config, tmp_path, monkeypatch, caplog,
                                                       ending):  # fmt: skip
    sets = ["train.max_steps=6", "train.valid_every=4", "train.average_last=1",
            "train.valid_bleu=false", "train.best_metric=loss", "train.log_every=100"]  # fmt: skip
    if ending == "time_up":
        sets += ["train.max_steps=100000", "train.max_minutes=0.002"]
    if ending == "early_stop":
        sets += ["train.patience=1", "train.max_steps=100"]
        losses = iter([1.0, 2.0, 3.0])
        monkeypatch.setattr(
            Trainer, "validate", lambda self: {"val_loss": next(losses), "val_ppl": 1.0}
        )
    if ending == "signal":
        real_step = Trainer.train_step

        def signalled(self, *args, **kwargs):
            if self.state.step == 1:  # SIGTERM during step 2: step 3 sees it, then the run stops
                os.kill(os.getpid(), signal.SIGTERM)
            return real_step(self, *args, **kwargs)

        monkeypatch.setattr(Trainer, "train_step", signalled)
    cfg = load_config(tiny_config, sets)
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="transformer_mt"):
        state = Trainer(cfg, run, progress=False).run()
    saved = torch.load(run / "last.pt", weights_only=True)["step"]
    assert saved == state.step, "every ending leaves a checkpoint of its last step"
    messages = caplog.text
    expected = {
        "max_steps": (6, None),
        "time_up": (None, "train.max_minutes=0.002 spent at step"),
        "early_stop": (8, "early stopping: no improvement in 1 validations"),
        "signal": (3, "stopped by signal at step 3; resume with the same command"),
    }[ending]
    if expected[0] is not None:
        assert state.step == expected[0]
    if expected[1] is not None:
        assert expected[1] in messages
    # A run stopped by a signal is to be resumed: no average; every other ending writes one.
    assert (run / "average.pt").is_file() == (ending != "signal")
    # The steps since the last metrics line (log_every is 100) get one at the end.
    assert [r["step"] for r in _metrics(run) if "loss" in r] == [state.step]
    if ending == "signal":  # saved for the resume alone: no step file crowds out a validated one
        assert sorted(p.name for p in run.glob("step_*.pt")) == []
        return
    # The run has ended: the same command again trains no step and rewrites nothing (an early-
    # stopped or timed-out run took more steps before; validate would now raise StopIteration).
    before = {p.name: p.stat().st_mtime_ns for p in run.glob("*.pt")}
    assert Trainer(cfg, run, progress=False).run().step == state.step
    assert {p.name: p.stat().st_mtime_ns for p in run.glob("*.pt")} == before


def test_nonfinite_loss_skips_the_step_then_stops(tiny_config, tmp_path, monkeypatch):
    real = trainer_mod.linear_label_smoothed_nll
    calls = {"n": 0}

    def nan_on_third_call(*args, **kwargs):
        calls["n"] += 1
        loss, nll = real(*args, **kwargs)
        return (loss * float("nan"), nll) if calls["n"] == 3 else (loss, nll)

    monkeypatch.setattr(trainer_mod, "linear_label_smoothed_nll", nan_on_third_call)
    cfg = load_config(tiny_config, ["train.max_steps=4", "train.valid_bleu=false",
                                    "train.best_metric=loss"])  # fmt: skip
    with pytest.warns(UserWarning, match="non-finite loss"):
        state = Trainer(cfg, tmp_path / "a", progress=False).run()
    # 5 batches consumed for 4 steps: the NaN batch was skipped, not retried or counted.
    assert state.step == 4 and state.batch_in_epoch == 5

    monkeypatch.setattr(
        trainer_mod,
        "linear_label_smoothed_nll",
        lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]),
    )
    cfg = load_config(tiny_config, ["train.max_nonfinite=3"])
    with pytest.warns(UserWarning), pytest.raises(MTError, match=r"3 steps in a row.*lr_factor"):
        Trainer(cfg, tmp_path / "b", progress=False).run()


def _train_cmd(config: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "transformer_mt", "train", "--config", str(config),
            "--run-dir", str(run_dir), "--no-progress"]  # fmt: skip


def _mixed_sources(tmp_path: Path, text: str) -> str:
    """TINY_CONFIG's toy corpus as two weighted training sources (a text pair and a TSV)."""
    from transformer_mt.data.toy import toy_splits

    splits = toy_splits(400, 20, 20, seed=1)
    for name, pairs in (("a", splits["train"][:250]), ("valid", splits["valid"])):
        (tmp_path / f"{name}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (tmp_path / f"{name}.trg").write_text("".join(t + "\n" for _, t in pairs))
    (tmp_path / "b.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in splits["train"][250:]))
    sources = (
        f"  train:\n    - {{src: {tmp_path}/a.src, trg: {tmp_path}/a.trg, weight: 0.5}}\n"
        f"    - {{tsv: {tmp_path}/b.tsv, weight: 1.5}}\n"
        f"  valid: {{src: {tmp_path}/valid.src, trg: {tmp_path}/valid.trg}}\n"
    )
    return text.replace("  corpus: toy\n", sources)


@pytest.mark.parametrize(
    "variant",
    ["best", "sampled", "mixed", "multilingual"],
    ids=["best-segmentation", "sampled-subwords", "weighted-sources", "two-targets"],
)
def test_resume_after_sigkill_reproduces_the_uninterrupted_run(tmp_path, variant):
    config = tmp_path / "c.yaml"
    from conftest import TINY_CONFIG

    text = TINY_CONFIG.format(cache=tmp_path / "cache", steps=30)
    if variant == "sampled":  # each epoch a new segmentation: the resumed run must draw the same
        text = text.replace("  vocab_size: 300\n", "  vocab_size: 300\n  sample_alpha: 0.1\n")
        assert "sample_alpha" in text, "TINY_CONFIG changed: put sample_alpha under tokenizer"
    if variant == "mixed":  # each epoch a new draw of the half-weighted source's pairs
        text = _mixed_sources(tmp_path, text)
        assert "weight: 1.5" in text, "TINY_CONFIG changed: it must name corpus: toy"
    if variant == "multilingual":  # two targets by tag, validated per pair
        toy = "    - {corpus: toy, trg_lang: trg}\n    - {corpus: toy, trg_lang: trg2}\n"
        text = text.replace("  corpus: toy\n", f"  train:\n{toy}  valid:\n{toy}")
        assert "trg2" in text, "TINY_CONFIG changed: it must name corpus: toy"
    config.write_text(text)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(_train_cmd(config, tmp_path / "whole"), check=True, env=env, capture_output=True)

    run = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(config, run), env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = (
        torch.load(run / "last.pt", weights_only=True)["step"] if (run / "last.pt").exists() else 0
    )
    assert 10 <= killed_at < 30, "the run must be killed part-way for this test to mean anything"
    rerun = subprocess.run(
        _train_cmd(config, run), check=True, env=env, capture_output=True, text=True
    )
    assert f"at step {killed_at}" in rerun.stderr, "the second run must resume, not restart"

    whole, resumed = _metrics(tmp_path / "whole"), _metrics(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    for a, b in zip(whole, resumed, strict=True):
        for key in ("loss", "lr", "val_loss", "val_bleu"):
            if key in a:
                assert b[key] == a[key], f"step {a['step']}: {key} {b[key]} != {a[key]}"
    w = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)["model"]
    r = torch.load(run / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(w[k], r[k]) for k in w)


def _sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_sigterm_saves_a_checkpoint_exits_143_and_the_rerun_continues(tmp_path):
    from conftest import TINY_CONFIG

    config = tmp_path / "c.yaml"
    # Far more steps than the test waits for: only the signal ends this run.
    config.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=100_000))
    fast = _sets("train.valid_bleu=false", "train.best_metric=loss", "train.valid_every=100000")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = tmp_path / "run"
    proc = subprocess.Popen(
        _train_cmd(config, run) + fast, env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    metrics = run / "metrics.jsonl"
    while proc.poll() is None and time.time() < deadline:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    # Saved and resumable, but not finished: the shell's code for SIGTERM, so `&& next` stops.
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    stopped_at = torch.load(run / "last.pt", weights_only=True)["step"]
    assert 3 <= stopped_at < 100_000
    assert f"stopped by signal at step {stopped_at}" in stderr
    assert _metrics(run)[-1]["step"] == stopped_at, "the checkpoint holds the last logged step"

    rerun = subprocess.run(
        _train_cmd(config, run) + fast + _sets(f"train.max_steps={stopped_at + 2}"),
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert f"at step {stopped_at}" in rerun.stderr, "the second run must resume, not restart"
    steps = [r["step"] for r in _metrics(run) if "loss" in r]
    assert steps == list(range(1, stopped_at + 3))
    assert torch.load(run / "last.pt", weights_only=True)["step"] == stopped_at + 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu_with_finite_losses(tiny_config, tmp_path, precision):
    cfg = load_config(tiny_config, [f"train.precision={precision}", "train.max_steps=3",
                                    "train.valid_bleu=false", "train.best_metric=loss"])  # fmt: skip
    trainer = Trainer(cfg, tmp_path / "run", progress=False)
    assert trainer.state.step == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped (non-finite) step warns: make it fail here
        state = trainer.run()
    assert state.step == 3
    lines = _metrics(tmp_path / "run")
    assert all(math.isfinite(r["loss"]) for r in lines if "loss" in r)
    assert all(math.isfinite(r["val_loss"]) for r in lines if "val_loss" in r)
    scaler = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_state"]["scaler"]
    assert ("scale" in scaler) == (precision == "fp16"), "fp16 keeps a gradient scaler's state"


def test_a_run_saved_before_fused_adam_resumes_fused_under_fp16(tiny_config, tmp_path):
    # The saved parameter groups name the implementation they ran with (fused None for runs
    # saved before fused AdamW); loaded as they are, the optimizer runs unfused, and under
    # fp16's gradient scaler an unfused Adam refuses the scaler's arguments on its first step.
    run = tmp_path / "run"
    settings = ["train.precision=fp16", "train.valid_bleu=false", "train.best_metric=loss"]
    Trainer(load_config(tiny_config, [*settings, "train.max_steps=2"]), run, progress=False).run()
    saved = torch.load(run / "last.pt", weights_only=True)
    for group in saved["train_state"]["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=None)
    ckpt_mod.save_checkpoint(saved, run / "last.pt")
    trainer = Trainer(
        load_config(tiny_config, [*settings, "train.max_steps=4"]), run, progress=False
    )
    assert trainer.state.step == 2
    assert all(group["fused"] for group in trainer.optimizer.param_groups)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer.run().step == 4


def test_an_unsupported_autocast_precision_fails_before_training(
    tiny_config, tmp_path, monkeypatch
):
    # torch only warns and falls back to fp32 for an autocast dtype a device lacks; simulate that.
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: False)
    cfg = load_config(tiny_config, ["train.precision=fp16"])
    with pytest.raises(MTError, match=r"train\.precision=fp16 is not supported.*bf16 or fp32"):
        Trainer(cfg, tmp_path / "run", progress=False)


def test_early_stopping_keeps_the_best_and_stops_after_patience(tiny_config, tmp_path, monkeypatch):
    # Validation BLEU is forced to fall after the first validation, so the best stays at step 10.
    scores = iter([30.0, 20.0, 25.0, 10.0, 5.0])
    monkeypatch.setattr(
        Trainer,
        "validate",
        lambda self: {"val_loss": 1.0, "val_ppl": 2.7, "val_bleu": next(scores)},
    )
    cfg = load_config(tiny_config, ["train.max_steps=60", "train.patience=2"])
    state = Trainer(cfg, tmp_path / "run", progress=False).run()
    assert state.step == 30, "two validations without improvement after step 10"
    assert state.best == 30.0 and state.bad_validations == 2
    assert torch.load(tmp_path / "run" / "best.pt", weights_only=True)["step"] == 10
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["step"] == 30


def test_tensorboard_without_the_package_is_a_clear_error(tiny_config, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    cfg = load_config(tiny_config, ["train.tensorboard=true"])
    with pytest.raises(MTError, match="pip install tensorboard"):
        Trainer(cfg, tmp_path / "run", progress=False).run()


def test_time_budget_validates_saves_and_stops(tiny_config, tmp_path):
    cfg = load_config(tiny_config, ["train.max_steps=1000", "train.max_minutes=0.002"])
    state = Trainer(cfg, tmp_path / "run", progress=False).run()
    assert 1 <= state.step < 1000
    assert state.train_seconds >= 0.12
    lines = _metrics(tmp_path / "run")
    assert lines[-1]["step"] == state.step and "val_bleu" in lines[-1], "a final validation"
    assert all(a["time_s"] <= b["time_s"] for a, b in itertools.pairwise(lines))
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["step"] == state.step


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothing_loss_and_gradient_equal_torch_cross_entropy(epsilon):
    # The hand-written backward must be the exact gradient: compare loss and gradient with torch's
    # own cross_entropy (same label_smoothing definition) in float64, pad positions included.
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[0, 2:] = 0  # padding
    target[2, 4] = 0
    ours, nll = label_smoothed_nll(logits, target, pad_idx=0, epsilon=epsilon)
    (g_ours,) = torch.autograd.grad(2.5 * ours, logits)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0,
                          label_smoothing=epsilon, reduction="sum")  # fmt: skip
    (g_ref,) = torch.autograd.grad(2.5 * ref, logits)
    plain = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(plain.item(), rel=1e-6) and not nll.requires_grad
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-7)
    assert g_ours[0, 2:].abs().max() == 0, "padding positions get no gradient"


def test_label_smoothing_gradient_keeps_the_dtype_of_bf16_logits():
    logits = torch.randn(2, 3, 7).bfloat16().requires_grad_()
    target = torch.tensor([[1, 2, 0], [3, 4, 5]])
    loss, _ = label_smoothed_nll(logits, target, pad_idx=0, epsilon=0.1)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16
    ref = F.cross_entropy(logits.float().view(-1, 7), target.view(-1), ignore_index=0,
                          label_smoothing=0.1, reduction="sum")  # fmt: skip
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_keep_freed_memory_applies_on_linux_glibc():
    applied = keep_freed_memory()
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert applied == on_glibc
    x = torch.ones(40 << 20, dtype=torch.uint8)  # over the former 32 MiB mmap threshold
    assert int(x.sum()) == 40 << 20, "large allocations still work"


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim is glibc's",
)
def test_release_freed_memory_returns_the_holes_between_live_blocks():
    keep_freed_memory()  # from here on freed heap blocks stay resident, as in training
    blocks = [torch.ones(1 << 20, dtype=torch.uint8) for _ in range(400)]  # 1 MiB each, heap
    del blocks[::2]  # 200 MiB of holes, each between two live blocks: no trim at the top frees it
    before = resident_mib()
    assert release_freed_memory()
    after = resident_mib()
    assert before - after > 150, f"RSS {before:.0f} -> {after:.0f} MiB"
    assert all(int(b[-1]) == 1 for b in blocks), "live blocks keep their contents"


_NEW_SHAPE_EVERY_STEP = """
import random, sys, torch
from transformer_mt.host_memory import bound_kernel_caches, keep_freed_memory, resident_mib
if sys.argv[1] == "bounded":
    bound_kernel_caches(8)  # small, so that both caches are full before the measurement starts
keep_freed_memory()
torch.set_num_threads(1)
lin = torch.nn.Linear(256, 1024)
random.seed(0)
for i in range(160):
    x = torch.randn(random.randint(200, 4096), 256, requires_grad=True)  # a new token count
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x).float().sum().backward()
    if i == 30:
        start = resident_mib()
print(resident_mib() - start)
"""


@pytest.mark.skipif(
    not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="bf16 products do not use oneDNN"
)
def test_bounded_kernel_caches_stop_memory_growing_with_new_shapes():
    caches = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # Trainer tests set them
    env = {k: v for k, v in os.environ.items() if k not in caches} | {"OMP_NUM_THREADS": "1"}

    def growth(mode: str) -> float:
        cmd = [sys.executable, "-c", _NEW_SHAPE_EVERY_STEP, mode]
        return float(
            subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        )

    unbounded, bounded = growth("default"), growth("bounded")
    assert unbounded > 150, f"the default caches grew only {unbounded:.0f} MiB: nothing to bound"
    assert bounded < unbounded / 3, f"RSS grew {bounded:.0f} MiB bounded, {unbounded:.0f} not"


def test_bound_kernel_caches_leaves_a_users_setting(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    bound_kernel_caches(32)
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "32"


def test_average_last_writes_the_mean_of_the_last_step_checkpoints(tiny_config, tmp_path):
    cfg = load_config(tiny_config, ["train.max_steps=30", "train.keep_last=2",
                                    "train.average_last=2", "train.valid_bleu=false",
                                    "train.best_metric=loss"])  # fmt: skip
    run = tmp_path / "run"
    Trainer(cfg, run, progress=False).run()
    avg = torch.load(run / "average.pt", weights_only=True)
    a, b = (torch.load(run / f"step_{n}.pt", weights_only=True)["model"] for n in (20, 30))
    assert avg["averaged_from"] == [str(run / "step_20.pt"), str(run / "step_30.pt")]
    assert avg["step"] == 30 and "train_state" not in avg
    for name, value in avg["model"].items():
        torch.testing.assert_close(value, (a[name] + b[name]) / 2, rtol=1e-6, atol=1e-7)
    assert not torch.equal(a["src_emb.weight"], b["src_emb.weight"]), "two different checkpoints"

    # A run that ended without its average (killed while writing it) gets it on the next call,
    # which has no steps left to train; a signal during the last step does not cost the average.
    (run / "average.pt").unlink()
    again = Trainer(cfg, run, progress=False)
    signalled = StepResult(0.0, 0.0, 0.0, 0.0, stop=True, time_up=False)
    assert again._stop_reason(signalled, early_stop=False) is StopReason.MAX_STEPS
    again.run()
    redone = torch.load(run / "average.pt", weights_only=True)
    assert redone["averaged_from"] == avg["averaged_from"]
    for name, value in avg["model"].items():
        assert torch.equal(redone["model"][name], value)

    # Weights without a training state are not a run to resume.
    ckpt_mod.save_checkpoint(avg, run / "last.pt")
    with pytest.raises(MTError, match=r"last\.pt holds weights only .* new --run-dir"):
        Trainer(cfg, run, progress=False)


def test_a_run_resumed_with_another_seed_ends_with_a_fresh_average(tiny_config, tmp_path):
    sets = ["train.keep_last=2", "train.average_last=2", "train.valid_bleu=false",
            "train.best_metric=loss"]  # fmt: skip
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, [*sets, "train.max_steps=20"]), run, progress=False).run()
    first = torch.load(run / "average.pt", weights_only=True)
    more = load_config(tiny_config, [*sets, "train.max_steps=30", "train.seed=2"])
    Trainer(more, run, progress=False).run()  # refused "another run" at its end before
    avg = torch.load(run / "average.pt", weights_only=True)
    assert avg["step"] == 30 and first["step"] == 20
    assert avg["averaged_from"] == [str(run / "step_20.pt"), str(run / "step_30.pt")]


def test_averaging_refuses_checkpoints_of_another_tokenizer(tiny_config, tmp_path):
    cfg = load_config(tiny_config, ["train.max_steps=2", "train.valid_bleu=false",
                                    "train.best_metric=loss"])  # fmt: skip
    Trainer(cfg, tmp_path / "run", progress=False).run()
    other = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    other["trg_spm"] += b"\n"  # same model shape and vocabulary size, another tokenizer
    ckpt_mod.save_checkpoint(other, tmp_path / "other.pt")
    with pytest.raises(MTError, match=r"other\.pt: another tokenizer than .*last\.pt"):
        ckpt_mod.average_checkpoints(
            [tmp_path / "run" / "last.pt", tmp_path / "other.pt"], tmp_path / "avg.pt"
        )
    assert not (tmp_path / "avg.pt").exists()


def test_average_last_beyond_keep_last_is_a_config_error(tiny_config):
    with pytest.raises(MTError, match=r"train.average_last=3 .* train.keep_last=1"):
        load_config(tiny_config, ["train.average_last=3"])


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_chunked_projection_and_loss_equal_the_unfused_pair(epsilon, monkeypatch):
    # Blocks of 3 rows (13 rows in all: a short last block): loss, NLL and the gradients of the
    # hidden states and of the weight equal those of logits = hidden @ weight.T + the plain loss.
    monkeypatch.setattr(loss_mod, "_CHUNK_BYTES", 3 * 4 * 11)
    torch.manual_seed(0)
    hidden = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 11, (13,))
    target[[2, 7, 8]] = 0  # padding
    ref, ref_nll = label_smoothed_nll(hidden @ weight.T, target, pad_idx=0, epsilon=epsilon)
    g_ref = torch.autograd.grad(1.5 * ref, (hidden, weight))
    ours, nll = linear_label_smoothed_nll(hidden, weight, target, pad_idx=0, epsilon=epsilon)
    g_ours = torch.autograd.grad(1.5 * ours, (hidden, weight))
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert g_ours[0][[2, 7, 8]].abs().max() == 0, "padding rows get no gradient"


def test_chunked_loss_in_bf16_reaches_a_tied_embedding(tiny_model_args):
    # Under bf16 the products round, so compare loosely; the tied weight must receive the gradient
    # of both its uses (embedding lookup and output projection), as with the model's own logits.
    from transformer_mt.model import Transformer

    torch.manual_seed(0)
    model = Transformer(**tiny_model_args).eval()  # no dropout: both passes see the same net
    src = torch.randint(4, tiny_model_args["enc_voc_size"], (3, 5))
    trg = torch.randint(4, tiny_model_args["dec_voc_size"], (3, 6))
    trg[0, 4:] = 0
    out = trg.roll(-1, dims=1)
    ref, _ = label_smoothed_nll(model(src, trg), out, 0, 0.1)
    ref.backward()
    g_ref = model.trg_emb.weight.grad.clone()
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(src, trg, features_only=True)
    ours, _ = linear_label_smoothed_nll(hidden, model.out.weight, out, 0, 0.1, torch.bfloat16)
    ours.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-3)
    g = model.trg_emb.weight.grad
    assert g.dtype == torch.float32
    cos = F.cosine_similarity(g.flatten(), g_ref.flatten(), dim=0)
    assert cos > 0.99, f"bf16 gradient direction differs from fp32: cosine {cos:.4f}"


def test_atomic_write_keeps_an_old_files_mode_and_gives_new_ones_the_umask(tmp_path):
    from transformer_mt.fileio import write_text_atomic

    old = tmp_path / "old.txt"
    old.write_text("x")
    old.chmod(0o640)
    write_text_atomic(old, "y")
    assert old.read_text() == "y" and stat.S_IMODE(old.stat().st_mode) == 0o640
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new.txt", "z")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644


@pytest.mark.slow
def test_compiled_training_follows_eager_training(tiny_config, tmp_path):
    """``train.compile: true`` (torch.compile) trains the same model as eager mode: equal losses
    step by step (without dropout, whose compiled random draws may differ; both on the bounded
    shapes that compiling resolves train.pad_to_multiple to), and checkpoints with a plain
    Transformer's keys; with dropout and bf16 autocast it trains too."""
    plain = ["train.max_steps=4", "train.valid_bleu=false", "train.best_metric=loss",
             "train.pad_to_multiple=8"]  # fmt: skip
    exact = [*plain, "model.drop_prob=0.0"]
    Trainer(load_config(tiny_config, exact), tmp_path / "eager", progress=False).run()
    compiled = [*exact, "train.compile=true"]
    Trainer(load_config(tiny_config, compiled), tmp_path / "compiled", progress=False).run()
    eager_loss = [r["loss"] for r in _metrics(tmp_path / "eager") if "loss" in r]
    compiled_loss = [r["loss"] for r in _metrics(tmp_path / "compiled") if "loss" in r]
    assert len(eager_loss) == 4
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-4)
    eager_sd = torch.load(tmp_path / "eager" / "last.pt", weights_only=True)["model"]
    compiled_sd = torch.load(tmp_path / "compiled" / "last.pt", weights_only=True)["model"]
    # The weights are not compared: Adam divides by the gradient's running RMS, so the
    # compiled kernels' rounding moves parameters whose gradients are ~0 by up to lr per step.
    assert compiled_sd.keys() == eager_sd.keys(), "no torch.compile prefix in the checkpoint"

    dropout = [*plain, "train.compile=true", "train.precision=bf16"]
    state = Trainer(load_config(tiny_config, dropout), tmp_path / "bf16", progress=False).run()
    assert state.step == 4
    assert all(math.isfinite(r["loss"]) for r in _metrics(tmp_path / "bf16") if "loss" in r)


def test_resuming_mid_epoch_with_other_batching_starts_the_next_epoch(tiny_config, tmp_path,
                                                                      caplog):  # fmt: skip
    """The saved position counts batches as the run cut them; with another batch_tokens (or
    seed, or process count) the same count would repeat or skip part of the epoch."""
    sets = ["train.valid_bleu=false", "train.best_metric=loss"]
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, [*sets, "train.max_steps=3"]), run, progress=False).run()
    same = Trainer(load_config(tiny_config, [*sets, "train.max_steps=6"]), run, progress=False)
    assert (same.state.epoch, same.state.batch_in_epoch) == (0, 3)
    same.close()
    with caplog.at_level("WARNING", logger="transformer_mt"):
        other = Trainer(
            load_config(tiny_config, [*sets, "train.max_steps=6", "train.batch_tokens=300"]),
            run,
            progress=False,
        )
    assert (other.state.epoch, other.state.batch_in_epoch) == (1, 0)
    assert "train.batch_tokens 400 -> 300); resuming at the start of epoch 1" in caplog.text
    assert other.run().step == 6


def test_validation_bleu_uses_the_configured_tokenizer(tiny_config, tmp_path):
    """train.valid_bleu_tokenize reaches sacrebleu, and the signature a checkpoint reports names
    it (a Chinese target needs zh: 13a sees one word a sentence)."""
    from transformer_mt.engines.loading import load_for_inference, validation_report

    run = tmp_path / "run"
    cfg = load_config(tiny_config, ["train.max_steps=100", "train.valid_bleu_tokenize=char"])
    trainer = Trainer(cfg, run, progress=False)
    trainer.run()
    by_char = trainer.validate()["val_bleu"]
    trainer.cfg.train.valid_bleu_tokenize = "13a"
    by_word = trainer.validate()["val_bleu"]
    assert by_char != by_word
    report = validation_report(load_for_inference(run / "last.pt"))
    assert report is not None and "|tok:char|" in report["signature"]
    with pytest.raises(MTError, match=r"train.valid_bleu_tokenize='spm': expected one of 13a"):
        load_config(tiny_config, ["train.valid_bleu_tokenize=spm"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_with_an_output_bias_equals_the_unfused_pair(dtype):
    """An imported model's output projection has a bias: the fused loss adds it to each block
    and returns its gradient, as the unfused pair does."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 7, 16, requires_grad=True)
    weight, bias = torch.randn(50, 16, requires_grad=True), torch.randn(50, requires_grad=True)
    target = torch.randint(1, 50, (2, 7))
    target[0, -2:] = 0  # padding
    fused, _ = linear_label_smoothed_nll(hidden, weight, target, 0, 0.1, dtype, bias=bias)
    fused.backward()
    grads = [p.grad.clone() for p in (hidden, weight, bias)]
    for p in (hidden, weight, bias):
        p.grad = None
    logits = (hidden.to(dtype) @ weight.to(dtype).T).float() + bias
    plain, _ = label_smoothed_nll(logits, target, 0, 0.1)
    plain.backward()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert abs(fused.item() - plain.item()) < tol * abs(plain.item())
    for got, p in zip(grads, (hidden, weight, bias), strict=True):
        assert torch.allclose(got, p.grad, atol=tol), (got - p.grad).abs().max()


def test_weight_gradient_over_groups_of_blocks_equals_the_unfused_pair(monkeypatch):
    """In bf16 the weight's gradient is one product per group of blocks: blocks of 3 rows, groups
    of 2 blocks, 23 kept rows (8 blocks, the last of 2 rows), padding between:
    loss and gradients as the unfused pair's in bf16."""
    vocab = 50
    monkeypatch.setattr(loss_mod, "_CHUNK_BYTES", 3 * 4 * vocab)
    monkeypatch.setattr(loss_mod, "_GROUP_BYTES", 2 * 3 * 2 * vocab)
    torch.manual_seed(0)
    hidden = torch.randn(2, 13, 16, requires_grad=True)
    weight = torch.randn(vocab, 16, requires_grad=True)
    target = torch.randint(1, vocab, (2, 13))
    target[0, 5], target[1, -2:] = 0, 0  # padding: 23 rows kept
    fused, _ = linear_label_smoothed_nll(hidden, weight, target, 0, 0.1, torch.bfloat16)
    fused.backward()
    grads = [p.grad.clone() for p in (hidden, weight)]
    for p in (hidden, weight):
        p.grad = None
    logits = (hidden.bfloat16() @ weight.bfloat16().T).float()
    plain, _ = label_smoothed_nll(logits, target, 0, 0.1)
    plain.backward()
    assert abs(fused.item() - plain.item()) < 1e-3 * abs(plain.item())
    for got, p in zip(grads, (hidden, weight), strict=True):
        assert torch.allclose(got, p.grad, atol=5e-2), (got - p.grad).abs().max()
