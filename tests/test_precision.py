"""``train.precision: auto``: the device's choice (bf16 where it runs natively and a probe finds it
faster, else fp32), said in the log and the metrics, recorded in checkpoints and kept on resume,
so that a resumed run computes as the uninterrupted one did."""

import json
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import load_checkpoint, save_checkpoint
from transformer_mt.config import load_config
from transformer_mt.errors import MTError
from transformer_mt.training.device import choose_precision, cpu_has_native_bf16
from transformer_mt.training.trainer import Trainer


def _flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    line = next((x for x in text.splitlines() if x.startswith("flags")), "flags:")
    return set(line.split(":", 1)[1].split())


def test_native_bf16_is_read_from_the_cpus_flags():
    assert cpu_has_native_bf16() == bool({"avx512_bf16", "amx_bf16"} & _flags())


def test_auto_on_a_cpu_says_why():
    precision, why = choose_precision(torch.device("cpu"), 64, 256, 512)
    assert precision in ("fp32", "bf16")
    if not cpu_has_native_bf16():
        assert precision == "fp32" and "no AVX512-BF16 or AMX" in why
    else:
        speedup = float(why.split("ran bf16 ")[1].split("x")[0])
        assert (precision == "bf16") == (speedup > 1.15), why


def test_a_precision_that_does_not_exist_is_refused(tiny_config):
    with pytest.raises(
        MTError, match=r"train.precision='fp8': expected one of auto, fp32, bf16, fp16"
    ):
        load_config(tiny_config, ["train.precision=fp8"])


def test_auto_is_logged_recorded_and_kept_on_resume(tiny_config, tmp_path, caplog):
    run = tmp_path / "run"
    sets = ["train.precision=auto", "train.max_steps=10", "train.valid_every=10"]
    with caplog.at_level("INFO", logger="transformer_mt"):
        Trainer(load_config(tiny_config, sets), run, progress=False).run()
    chosen = load_checkpoint(run / "last.pt")["train_state"]["precision"]
    assert chosen in ("fp32", "bf16")
    assert f"precision {chosen} (auto: " in caplog.text
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in records if "val_loss" in r] == [chosen]

    # A resume keeps what the run chose at its start, whatever a new probe would say: here
    # the recorded choice is changed to the other one, and the resumed run takes it.
    other = "bf16" if chosen == "fp32" else "fp32"
    ckpt = load_checkpoint(run / "last.pt")
    ckpt["train_state"]["precision"] = other
    save_checkpoint(ckpt, run / "last.pt")
    caplog.clear()
    more = [*sets[:1], "train.max_steps=12", "train.valid_every=10"]
    with caplog.at_level("INFO", logger="transformer_mt"):
        Trainer(load_config(tiny_config, more), run, progress=False).run()
    assert f"precision {other} (auto: as the run chose at its start)" in caplog.text
    assert load_checkpoint(run / "last.pt")["train_state"]["precision"] == other


def test_a_set_precision_is_used_as_it_is(tiny_config, tmp_path, caplog):
    sets = ["train.precision=bf16", "train.max_steps=2", "train.valid_every=2"]
    with caplog.at_level("INFO", logger="transformer_mt"):
        Trainer(load_config(tiny_config, sets), tmp_path / "run", progress=False).run()
    assert "precision bf16 (train.precision)" in caplog.text
