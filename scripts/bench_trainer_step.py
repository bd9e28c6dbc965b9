"""What `mt train` adds to a bare training step: Trainer.train_step (token counts, the fused
loss, gradient-norm measurement, the lr schedule, AdamW) against the bare step that bench_train.py
times (forward, loss, backward, Adam), on the same model and the same batches, in the same process,
alternating run by run. Each run takes its own ``--warmup`` + ``--steps`` batches of the epoch,
and both variants step through exactly those (which one goes first alternates from run to run).
Both collate their batch inside the timed step.

    python scripts/bench_trainer_step.py                      # configs/multi30k_de_en.yaml
    python scripts/bench_trainer_step.py --runs 6 --steps 20 --set data.base_url=http://127.0.0.1:8765/

Data and model come from the config (prepared as `mt train` prepares them: a first run may
download and binarize). The figure is target tokens per second, the median over ``--runs``.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_train import Contender, make_step  # this directory: the step bench_train.py times

from transformer_mt.config import load_config
from transformer_mt.data.batching import make_batches
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.training.batches import collate
from transformer_mt.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/multi30k_de_en.yaml")
    parser.add_argument("--set", action="append", default=[], help="config override key=value")
    parser.add_argument("--runs", type=int, default=4, help="timed runs per variant (median)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed steps before each timed run (the first step after a switch "
                        "pays for the other variant's memory)")  # fmt: skip
    args = parser.parse_args()
    for name, lowest in (("runs", 1), ("steps", 1), ("warmup", 0)):
        if getattr(args, name) < lowest:
            parser.error(f"--{name} must be at least {lowest}")

    cfg = load_config(args.config, args.set)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), resume=False, progress=False)
    data = trainer.data.train
    per_run = args.warmup + args.steps
    batches = make_batches(
        data.src_lengths, data.trg_lengths + 1, cfg.train.batch_tokens, seed=0, epoch=0
    )
    if len(batches) < args.runs * per_run:
        raise SystemExit(
            f"an epoch of the training data gives only {len(batches)} batches of "
            f"{cfg.train.batch_tokens} tokens, fewer than --runs {args.runs} x (--warmup "
            f"{args.warmup} + --steps {args.steps}) = {args.runs * per_run}; lower them"
        )
    model = trainer.model
    bare_opt = torch.optim.AdamW(  # the optimizer mt train builds
        model.parameters(),
        lr=1e-5,
        betas=(0.9, 0.98),
        eps=1e-9,
        weight_decay=0.0,
        fused=trainer.device.type in ("cpu", "cuda"),
    )
    bare = Contender("bare", model, bare_opt, [])
    step_of_bench_train = make_step(trainer.device, cfg.train.precision, "chunked")

    def bare_step(index: np.ndarray) -> None:
        step_of_bench_train(bare, collate(data, index))

    def trainer_step(index: np.ndarray) -> None:
        trainer.train_step([collate(data, index)], stop_requested=False, seconds=0.0)

    variants = {"mt train step": trainer_step, "bare step": bare_step}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    model.train()
    for run in range(args.runs):
        chunk = batches[run * per_run : (run + 1) * per_run]  # the same batches for both
        warm, timed = chunk[: args.warmup], chunk[args.warmup :]
        tokens = sum(int((collate(data, b)[2] != PAD_ID).sum()) for b in timed)
        order = list(variants) if run % 2 == 0 else list(reversed(variants))
        for name in order:
            step = variants[name]
            for b in warm:  # untimed: the first step after a switch pays for the other's memory
                step(b)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for b in timed:
                step(b)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()
            rates[name].append(tokens / (time.perf_counter() - start))
            print(f"  run {run + 1}: {name:>14} {rates[name][-1]:8,.0f} tok/s", flush=True)
    print(f"{args.config}, {cfg.train.precision}, device {trainer.device}")
    for name, values in rates.items():
        print(f"{name:>14}: median {statistics.median(values):,.0f} target tok/s")


if __name__ == "__main__":
    main()
