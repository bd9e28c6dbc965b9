"""One writer per run, resumes that never silently change the run, honest exit codes, no silent
hangs: the run lock, the data fingerprint, 130/143 on a signal, the collective timeout, a
half-written metrics line, leftover temporary files."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.config import load_config
from transformer_mt.errors import MTError
from transformer_mt.training.fingerprint import check_fingerprint
from transformer_mt.training.metrics import MetricsLog, read_records
from transformer_mt.training.run_dir import LOCK_FILE, RunLock
from transformer_mt.training.state import StopFlag, StoppedBySignal
from transformer_mt.training.trainer import Trainer

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
FAST = ["train.valid_bleu=false", "train.best_metric=loss"]

_HOLD_LOCK = """
import sys
from transformer_mt.training.run_dir import RunLock
lock = RunLock.acquire(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()  # hold it until killed
"""


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_a_second_train_on_a_locked_run_dir_fails_naming_the_holder(tiny_config, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (run / ".last.pt.abc123.tmp").write_bytes(b"a live writer's temporary file")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(run)], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(run)
        second = subprocess.run(
            [sys.executable, "-m", "transformer_mt", "train", "--config", str(tiny_config),
             "--run-dir", str(run), "--no-progress"],
            env=ENV, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"in use by another `mt train` (pid {holder.pid} on " in errors[0]
        assert "another --run-dir" in errors[0]
        assert _snapshot(run) == before, "the second process touched the run's files"
        assert not (tmp_path / "cache").exists(), "it failed before preparing any data"
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.wait()
    # The kernel released the dead holder's lock: the next run takes it at once.
    lock = RunLock.acquire(run)
    holder_info = json.loads((run / LOCK_FILE).read_text())
    assert holder_info["pid"] == os.getpid()
    lock.release()
    assert not (run / LOCK_FILE).exists()


def test_the_lock_is_held_for_the_run_and_cleaned_up_after(tiny_config, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_step = Trainer.train_step
    seen = []

    def probe(self, *args, **kwargs):
        if not seen:  # mid-run, in this same process: a second lock is refused
            with pytest.raises(MTError, match=f"in use .*pid {os.getpid()}"):
                RunLock.acquire(run)
            seen.append(True)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", probe)
    run.mkdir()
    leftovers = [".last.pt.x1.tmp", ".step_10.pt.x2.tmp", ".metrics.jsonl.x3.tmp"]
    for name in [*leftovers, ".notes.tmp", "notes.txt"]:
        (run / name).write_text("x")
    cfg = load_config(tiny_config, ["train.max_steps=2", *FAST])
    Trainer(cfg, run, progress=False).run()
    names = {p.name for p in run.iterdir()}
    assert seen and not names & set(leftovers), "a killed run's temporary files are removed"
    assert {".notes.tmp", "notes.txt", "last.pt"} <= names, "nothing else is"
    assert LOCK_FILE not in names, "released at the end of the run"


def test_a_run_that_fails_early_leaves_no_run_directory(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: False)  # fp16 "unsupported"
    cfg = load_config(tiny_config, ["train.precision=fp16"])
    with pytest.raises(MTError, match="not supported"):
        Trainer(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(MTError, match="is not a directory"):
        RunLock.acquire(tmp_path / "run")


def test_resume_on_changed_data_is_refused_unless_allowed(tiny_config, tmp_path, caplog):
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, ["train.max_steps=10", *FAST]), run, progress=False).run()
    last = torch.load(run / "last.pt", weights_only=True)
    assert set(last["train_state"]["data_fingerprint"]) == {
        "src_tokenizer", "trg_tokenizer", "train_data", "valid_data"
    }  # fmt: skip
    before = _snapshot(run)

    changed = load_config(tiny_config, ["train.max_steps=12", "data.toy_seed=2", *FAST])
    caches = set(Path(changed.data.cache_dir).iterdir())
    with pytest.raises(MTError) as err:
        Trainer(changed, run, progress=False)
    message = str(err.value)
    assert "was trained with other data settings (data.toy_seed 1234 -> 2)" in message
    assert "new --run-dir" in message and "--allow-data-change" in message
    assert "\n" not in message
    assert _snapshot(run) == before, "a refused resume leaves the run as it was"
    assert set(Path(changed.data.cache_dir).iterdir()) == caches, "refused before preparing"

    # What the config cannot show (the files themselves) the data's fingerprint catches.
    fingerprint = dict(last["train_state"]["data_fingerprint"], train_data="0" * 16)
    with pytest.raises(MTError, match="trained on other data: the training data changed;"):
        check_fingerprint(run / "last.pt", last, fingerprint, load_config(tiny_config), False)

    # A crash mid-write left half a metrics line: resume drops it with a warning.
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "loss": 1.2')
    with caplog.at_level("INFO", logger="transformer_mt"):
        state = Trainer(changed, run, progress=False, allow_data_change=True).run()
    assert state.step == 12
    assert "--allow-data-change" in caplog.text and "half-written last line" in caplog.text
    assert [r["step"] for r in read_records(run / "metrics.jsonl") if "loss" in r] == list(
        range(1, 13)
    )
    resumed = torch.load(run / "last.pt", weights_only=True)["train_state"]["data_fingerprint"]
    assert resumed != last["train_state"]["data_fingerprint"], "it now records the new data"


def test_a_new_run_where_another_left_checkpoints_is_refused(tiny_config, tmp_path):
    """Without resuming, a run directory that holds checkpoints is refused (the new run would
    prune its own step files before the old, higher-numbered ones and average the old weights);
    nothing there changes. Resuming the same directory works as before."""
    run = tmp_path / "run"
    cfg = load_config(tiny_config, ["train.max_steps=10", *FAST])
    Trainer(cfg, run, progress=False).run()
    before = _snapshot(run)
    result = CliRunner().invoke(
        app, ["train", "--config", str(tiny_config), "--run-dir", str(run), "--no-resume",
              "--no-progress", *[a for kv in FAST for a in ("--set", kv)]],
    )  # fmt: skip
    assert result.exit_code == 1
    assert f"error: {run} holds checkpoints of an earlier run (best.pt, last.pt, step_" in (
        result.output
    )
    assert "resume it (without --no-resume, with its last.pt)" in result.output
    assert "another --run-dir" in result.output and "Traceback" not in result.output
    assert _snapshot(run) == before, "the refused run changed nothing"
    (run / "last.pt").unlink()  # step files without last.pt: a resume is impossible, so refused
    with pytest.raises(MTError, match="holds checkpoints of an earlier run"):
        Trainer(cfg, run, progress=False)


def test_step_files_of_other_names_are_neither_pruned_nor_averaged(tiny_config, tmp_path):
    from transformer_mt.training.run_dir import RunDirectory

    cfg = load_config(tiny_config)
    for name in ("step_10.pt", "step_9.pt", "step_best.pt", "step_10_old.pt", "step_100.pt"):
        (tmp_path / name).write_bytes(b"")
    run_dir = RunDirectory(tmp_path, cfg, is_main=False)
    assert [p.name for p in run_dir.step_checkpoints()] == [
        "step_9.pt",
        "step_10.pt",
        "step_100.pt",
    ]


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_note(tiny_config, tmp_path, caplog):
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, ["train.max_steps=10", *FAST]), run, progress=False).run()
    ckpt = torch.load(run / "last.pt", weights_only=True)
    del ckpt["train_state"]["data_fingerprint"]  # as written before fingerprints
    torch.save(ckpt, run / "last.pt")
    cfg = load_config(tiny_config, ["train.max_steps=11", "data.toy_seed=2", *FAST])
    with caplog.at_level("INFO", logger="transformer_mt"):
        assert Trainer(cfg, run, progress=False).run().step == 11
    assert "records no fingerprint of its data" in caplog.text


def test_metrics_trim_drops_a_half_written_last_line_and_names_a_bad_middle_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = ['{"step": 1, "loss": 2.0}', '{"step": 2, "loss": 1.5}', '{"step": 3, "loss": 1.0}']
    path.write_text("\n".join(good) + '\n{"step": 4, "lo')
    MetricsLog(tmp_path, enabled=True).trim(2)
    assert path.read_text() == "\n".join(good[:2]) + "\n", "lines kept byte for byte"
    path.write_text(good[0] + "\n" + '{"step": 2, "lo\n' + good[2] + "\n")
    with pytest.raises(MTError, match=r"metrics\.jsonl:2: not a metrics record"):
        MetricsLog(tmp_path, enabled=True).trim(3)
    MetricsLog(tmp_path, enabled=True).trim(0)  # a fresh start: the old log goes, unread
    assert path.read_text() == ""


def test_stop_flag_remembers_the_first_signal_for_the_exit_code():
    with StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # within the grace period: the pair of torchrun
    assert flag.requested and flag.signum == signal.SIGINT
    assert StoppedBySignal(signal.SIGINT, 3).exit_code == 130
    assert StoppedBySignal(signal.SIGTERM, 3).exit_code == 143


def test_ctrl_c_saves_and_mt_train_exits_130(tiny_config, tmp_path, monkeypatch):
    real_step = Trainer.train_step

    def interrupted(self, *args, **kwargs):
        if self.state.step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    run = tmp_path / "run"
    args = ["train", "--config", str(tiny_config), "--run-dir", str(run), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--set", "train.max_steps=50"])
    assert result.exit_code == 130, result.output
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 3  # signalled in step 2


_STALL_RANK_2 = """
import signal, sys, time
from transformer_mt.training.trainer import Trainer
real_step = Trainer.train_step

def stalled(self, *args, **kwargs):
    if self.info.rank == 2 and self.state.step == 2:  # hangs before its third step
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # torchrun's SIGTERM ends it at once
        time.sleep(600)
    return real_step(self, *args, **kwargs)

Trainer.train_step = stalled
from transformer_mt.cli import main
sys.argv = ["mt", *sys.argv[1:]]
main()
"""


def test_a_stalled_rank_is_named_after_the_collective_timeout(tmp_path):
    from conftest import TINY_CONFIG

    from transformer_mt.data.prepare import prepare

    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=20))
    prepare(load_config(config), progress=False)  # the cache both ranks then read
    script = tmp_path / "stall.py"
    script.write_text(_STALL_RANK_2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3",
           str(script), "train", "--config", str(config), "--run-dir", str(tmp_path / "run"),
           "--no-progress", "--set", "train.collective_timeout_s=3", "--set", "model.drop_prob=0",
           *[arg for item in FAST for arg in ("--set", item)]]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors, result.stderr
    # Three ranks: a healthy one times out naming rank 2, and neither healthy rank is blamed. The
    # other healthy rank may see rank 2 killed first (torchrun stops the group when one rank
    # exits): then it names rank 2 as gone, which is also rank 2.
    timed_out = [e for e in errors if "rank 2 did not answer" in e and "collective_timeout_s" in e]
    assert timed_out, errors
    assert all(e.startswith("error: rank 2 ") for e in errors), errors
    assert took < 60, f"took {took:.0f} s"


def test_a_save_cut_short_never_leaves_last_pt_recording_a_best_that_best_pt_lacks(
    tiny_config, tmp_path, monkeypatch
):
    """A disk that fails (or a kill) between two of a validation's writes: best.pt is written
    before last.pt, so last.pt never records a best whose weights best.pt does not hold (a resume
    would not write best.pt again)."""
    from transformer_mt.training import run_dir as run_dir_mod

    cfg = load_config(tiny_config, ["train.max_steps=20", "train.valid_bleu=false",
                                    "train.best_metric=loss"])  # fmt: skip
    run = tmp_path / "run"
    real_save = run_dir_mod.save_checkpoint
    failed = []

    def best_pt_fails_at_step_20(ckpt, path, **kwargs):
        if ckpt["step"] == 20 and path.name == "best.pt":
            failed.append(path)
            raise OSError(28, "No space left on device", str(path))
        return real_save(ckpt, path, **kwargs)

    monkeypatch.setattr(run_dir_mod, "save_checkpoint", best_pt_fails_at_step_20)
    with pytest.raises((OSError, MTError)):
        Trainer(cfg, run, progress=False).run()
    assert failed, "the validation loss improved at step 20 (the tiny run's does)"
    last = torch.load(run / "last.pt", weights_only=True)
    best = torch.load(run / "best.pt", weights_only=True)
    # Before: last.pt of step 20 (recording step 20 as the best) beside best.pt of step 10.
    assert last["step"] == best["step"] == 10


# --- settings changed on resume ---------------------------------------------------------------


def _trained(tiny_config: Path, tmp_path: Path, *sets: str) -> Path:
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, ["train.max_steps=10", *FAST, *sets]), run,
            progress=False).run()  # fmt: skip
    return run


def test_a_resume_takes_the_configs_adamw_settings(tiny_config, tmp_path, caplog):
    """Loading the optimizer's state would bring back the betas, eps and weight decay it was
    saved with, while config.yaml and the next checkpoints record the new ones."""
    run = _trained(tiny_config, tmp_path)
    sets = ["train.weight_decay=0.1", "train.adam_beta2=0.999", "train.adam_eps=1e-6"]
    with caplog.at_level("INFO", logger="transformer_mt"):
        trainer = Trainer(load_config(tiny_config, [*FAST, *sets]), run, progress=False)
    group = trainer.optimizer.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["eps"]) == (0.1, (0.9, 0.999), 1e-6)
    assert "other AdamW settings" in caplog.text and "1e-09 -> 1e-06" in caplog.text
    assert trainer.run().step == 20


def test_a_resume_into_fp16_starts_a_fresh_gradient_scaler(tiny_config, tmp_path, caplog):
    run = _trained(tiny_config, tmp_path)  # fp32: its scaler was disabled and saved empty
    with caplog.at_level("INFO", logger="transformer_mt"):
        state = Trainer(load_config(tiny_config, [*FAST, "train.precision=fp16"]), run,
                        progress=False).run()  # fmt: skip
    assert state.step == 20 and "gradient scaler starts afresh" in caplog.text


def test_another_best_metric_on_resume_starts_the_best_value_over(tiny_config, tmp_path, caplog):
    """A best validation loss (4.2, say) must not be compared with a BLEU score: the best value
    and the patience count start over, and the next validation writes best.pt."""
    run = _trained(tiny_config, tmp_path)  # best_metric loss: best.pt at step 10
    sets = ["train.valid_bleu=true", "train.best_metric=bleu", "train.patience=1"]
    # A state written before it recorded its metric: the checkpoint's config tells it.
    ckpt = torch.load(run / "last.pt", weights_only=True)
    del ckpt["train_state"]["state"]["best_metric"]
    torch.save(ckpt, run / "last.pt")
    with caplog.at_level("WARNING", logger="transformer_mt"):
        trainer = Trainer(load_config(tiny_config, sets), run, progress=False)
    assert trainer.state.best is None and trainer.state.bad_validations == 0
    assert "train.best_metric loss -> bleu" in caplog.text
    state = trainer.run()
    assert state.step == 20 and state.best_metric == "bleu"
    assert torch.load(run / "best.pt", weights_only=True)["step"] == 20


def test_dropout_may_change_on_resume_and_a_shape_change_is_named(tiny_config, tmp_path, caplog):
    run = _trained(tiny_config, tmp_path)
    with pytest.raises(MTError, match=r"another model \(ffn_hidden 64 -> 128\); use a new"):
        Trainer(load_config(tiny_config, [*FAST, "model.ffn_hidden=128"]), run, progress=False)
    ckpt = torch.load(run / "last.pt", weights_only=True)  # as saved before attention dropout
    del ckpt["model_args"]["attn_drop_prob"]
    torch.save(ckpt, run / "last.pt")
    with caplog.at_level("INFO", logger="transformer_mt"):
        state = Trainer(load_config(tiny_config, [*FAST, "model.drop_prob=0.3"]), run,
                        progress=False).run()  # fmt: skip
    assert state.step == 20
    assert "other dropout rates: attn_drop_prob None -> 0.0, drop_prob 0.1 -> 0.3" in caplog.text
    assert torch.load(run / "last.pt", weights_only=True)["model_args"]["drop_prob"] == 0.3


def test_resuming_mid_epoch_with_other_subword_sampling_starts_the_next_epoch(
    tiny_config, tmp_path, caplog
):
    """Sampled segmentations have other lengths: the epoch is cut into other batches."""
    sampled = ["tokenizer.sample_alpha=0.1", "tokenizer.sample_draws=2", "train.max_steps=3"]
    run = tmp_path / "run"
    Trainer(load_config(tiny_config, [*FAST, *sampled]), run, progress=False).run()
    sets = [*FAST, *sampled, "tokenizer.sample_alpha=0.5", "train.max_steps=6"]
    with caplog.at_level("WARNING", logger="transformer_mt"):
        trainer = Trainer(load_config(tiny_config, sets), run, progress=False)
    assert (trainer.state.epoch, trainer.state.batch_in_epoch) == (1, 0)
    assert "tokenizer.sample_alpha 0.1 -> 0.5); resuming at the start of epoch 1" in caplog.text
    trainer.close()


def test_a_step_file_an_interrupted_save_left_out_is_written_on_resume(
    tiny_config, tmp_path, monkeypatch
):
    """Killed between last.pt and step_20.pt: the resumed run starts past step 20 and would
    never write it, so average.pt and keep_last would silently lack it."""
    from transformer_mt.training import run_dir as run_dir_mod

    real_save = run_dir_mod.save_checkpoint

    def step_file_fails_at_20(ckpt, path, **kwargs):
        if path.name == "step_20.pt":
            raise OSError(28, "No space left on device", str(path))
        return real_save(ckpt, path, **kwargs)

    monkeypatch.setattr(run_dir_mod, "save_checkpoint", step_file_fails_at_20)
    run, keep = tmp_path / "run", [*FAST, "train.keep_last=3"]
    with pytest.raises((OSError, MTError)):
        Trainer(load_config(tiny_config, [*keep, "train.max_steps=20"]), run, progress=False).run()
    monkeypatch.setattr(run_dir_mod, "save_checkpoint", real_save)
    assert not (run / "step_20.pt").exists()
    last_at_20 = (run / "last.pt").read_bytes()
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 20
    Trainer(load_config(tiny_config, [*keep, "train.max_steps=30"]), run, progress=False).run()
    assert (run / "step_20.pt").read_bytes() == last_at_20
    assert sorted(p.name for p in run.glob("step_*.pt")) == ["step_10.pt", "step_20.pt",
                                                              "step_30.pt"]  # fmt: skip


def test_a_run_that_ended_as_its_last_step_file_failed_gets_it_and_a_full_average(
    tiny_config, tmp_path, monkeypatch
):
    """Killed between last.pt and step_20.pt at the last step: the rerun finds the run ended and
    writes the missing average.pt, which must average step_20 too."""
    from transformer_mt.training import run_dir as run_dir_mod

    real_save = run_dir_mod.save_checkpoint

    def step_file_fails_at_20(ckpt, path, **kwargs):
        if path.name == "step_20.pt":
            raise OSError(28, "No space left on device", str(path))
        return real_save(ckpt, path, **kwargs)

    sets = [*FAST, "train.max_steps=20", "train.keep_last=2", "train.average_last=2"]
    run = tmp_path / "run"
    monkeypatch.setattr(run_dir_mod, "save_checkpoint", step_file_fails_at_20)
    with pytest.raises((OSError, MTError)):
        Trainer(load_config(tiny_config, sets), run, progress=False).run()
    monkeypatch.setattr(run_dir_mod, "save_checkpoint", real_save)
    assert not (run / "average.pt").exists()
    assert Trainer(load_config(tiny_config, sets), run, progress=False).run().step == 20
    average = torch.load(run / "average.pt", weights_only=True)
    assert [Path(p).name for p in average["averaged_from"]] == ["step_10.pt", "step_20.pt"]


def test_an_ended_run_keeps_the_config_it_trained_with(tiny_config, tmp_path):
    run = _trained(tiny_config, tmp_path)
    before = _snapshot(run)
    state = Trainer(load_config(tiny_config, [*FAST, "train.max_steps=5"]), run,
                    progress=False).run()  # fmt: skip
    assert state.step == 10
    assert _snapshot(run) == before, "nothing trained, nothing written (config.yaml included)"


def test_a_new_run_never_overwrites_files_it_did_not_write(tiny_config, tmp_path):
    """A new run writes config.yaml and the tokenizers and starts metrics.jsonl afresh: in a
    run directory where those are a user's (a config kept beside the run, passed as --config)
    or an earlier run's that saved no checkpoint, it is refused in one line and changes
    nothing; an empty metrics.jsonl is nothing to lose."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("# my notes\n" + tiny_config.read_text())
    (run / "metrics.jsonl").write_text('{"step": 50, "loss": 1.0, "nll": 1.0, "lr": 0.1}\n')
    before = _snapshot(run)
    sets = [a for kv in FAST for a in ("--set", kv)]
    args = ["train", "--config", str(run / "config.yaml"), "--run-dir", str(run), *sets]
    result = CliRunner().invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"error: {run} holds config.yaml, metrics.jsonl of an earlier run (or yours)" in (
        result.output
    )
    assert _snapshot(run) == before
    (run / "config.yaml").unlink()
    (run / "metrics.jsonl").write_text("")
    cfg = load_config(tiny_config, ["train.max_steps=2", *FAST])
    assert Trainer(cfg, run, progress=False).run().step == 2


def _plot(run: Path):
    return CliRunner().invoke(app, ["plot", str(run)])


def test_plot_names_a_complete_bad_last_line(tmp_path):
    """A bad last line that ends with a newline was written whole, not cut by a killed run:
    one error naming FILE:LINE and no picture (only a line without its newline is skipped)."""
    good = '{"step": 1, "loss": 5.0, "nll": 4.9, "lr": 0.001}\n'
    (tmp_path / "metrics.jsonl").write_text(good + good.replace("1,", "2,") + '{"step": 3, "lo\n')
    result = _plot(tmp_path)
    assert result.exit_code == 1 and "half-written" not in result.output
    assert f"error: {tmp_path}/metrics.jsonl:3: not a metrics record" in result.stderr
    (tmp_path / "metrics.jsonl").write_text(good + "[1, 2]\n\n")  # JSON, but not a record
    assert "metrics.jsonl:2: not a metrics record (not a JSON object" in _plot(tmp_path).stderr
    assert not (tmp_path / "metrics.png").exists()


def test_plot_of_a_run_without_metrics_yet_is_one_line(tmp_path):
    for content in (None, "", "\n", '{"step": 1, "lo'):  # none yet, or a first line being written
        if content is not None:
            (tmp_path / "metrics.jsonl").write_text(content)
        result = _plot(tmp_path)
        assert result.exit_code == 1, (content, result.output)
        assert f"error: {tmp_path} has no metrics yet" in result.stderr
    assert not (tmp_path / "metrics.png").exists()


def test_plot_names_a_line_whose_numbers_are_not_numbers(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 4, "loss": 5.0, "nll": null, "lr": 0.1}\n')
    result = _plot(tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "the line of step 4 has nll null, expected a number" in result.stderr
