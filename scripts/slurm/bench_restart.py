"""What an elastic restart costs: two torchrun agents on this machine (two "nodes" of one CPU
process each, gloo) train a recipe under ``--max-restarts 1``; rank 1's worker is SIGKILLed (or
SIGSTOPped) between two checkpoints, and the script prints, from that moment:

- noticed: when rank 0's process has ended (the group is torn down for the restart);
- back: when the restarted group has logged its first step after last.pt's;
- redone: the steps between last.pt and the kill, which the restarted group trains again.

    .venv/bin/python scripts/slurm/bench_restart.py [--config toy] [--signal KILL STOP]

The first run prepares the recipe's data (data.cache_dir), once. Figures are wall-clock seconds
on whatever else the machine is doing: run it on an idle one.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(run: Path) -> list[dict]:
    """The training lines of metrics.jsonl so far (a line being written is skipped)."""
    out = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if "loss" in record:
                out.append(record)
    return out


def _workers(agents: list[subprocess.Popen]) -> dict[int, int]:
    """Worker pid by global rank (each worker's RANK), from the agents' child processes."""
    found = {}
    for agent in agents:
        with contextlib.suppress(OSError):
            for pid in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split():
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                found.update({int(e[5:]): int(pid) for e in env if e.startswith(b"RANK=")})
    return found


def _wait(condition, timeout: float = 600.0, every: float = 0.02) -> float:
    """Poll ``condition()`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting; see the agents' logs")
        time.sleep(every)
    return time.monotonic()


def measure(args: argparse.Namespace, sig: signal.Signals, work: Path) -> dict[str, float]:
    """One run, one signal to rank 1 between checkpoints; the timings from the signal."""
    run = work / f"run-{sig.name}"
    sets = [
        f"train.max_steps={args.steps}",
        f"train.valid_every={args.valid_every}",
        "train.log_every=1",
        "train.valid_bleu=false",
        "train.best_metric=loss",
        f"train.collective_timeout_s={args.collective_timeout_s}",
    ]
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "transformer_mt.training.distributed",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-id",
        "bench",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--max-restarts",
        "1",
        "-m",
        "transformer_mt",
        "train",
        "--config",
        args.config,
        "--run-dir",
        str(run),
        "--no-progress",
        *[a for s in sets for a in ("--set", s)],
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    logs = [open(work / f"agent{i}-{sig.name}.log", "w") for i in range(2)]  # noqa: SIM115
    agents = [
        subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for log in logs
    ]
    try:
        # Past the first checkpoint by a few steps: those are lost and trained again.
        ckpt = args.valid_every
        _wait(lambda: len(_steps(run)) >= ckpt + args.past and 1 in _workers(agents))
        workers, before = _workers(agents), _steps(run)[-1]["step"]
        started = time.monotonic()
        os.kill(workers[1], sig)
        noticed = _wait(lambda: not Path(f"/proc/{workers[0]}").exists())
        back = _wait(lambda: ckpt < max((r["step"] for r in _steps(run)), default=0) < before)
        step_s = _steps(run)[-1]["time_s"] / max(1, _steps(run)[-1]["step"])
        return {
            "noticed_s": noticed - started,
            "back_s": back - started,
            "redone_steps": before - ckpt,
            "step_s": step_s,
        }
    finally:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="toy")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--valid-every", type=int, default=100, help="checkpoint interval")
    parser.add_argument("--past", type=int, default=20, help="steps past the checkpoint")
    parser.add_argument("--collective-timeout-s", type=float, default=20.0)
    parser.add_argument("--signal", nargs="+", default=["KILL", "STOP"], choices=["KILL", "STOP"])
    args = parser.parse_args()
    subprocess.run(
        [sys.executable, "-m", "transformer_mt", "prepare", "--config", args.config],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.signal:
            sig = signal.Signals[f"SIG{name}"]
            got = measure(args, sig, Path(tmp))
            print(
                f"SIG{name} to rank 1 (collective_timeout_s={args.collective_timeout_s:g}): "
                f"noticed after {got['noticed_s']:.1f} s, training again after "
                f"{got['back_s']:.1f} s, {got['redone_steps']} steps redone "
                f"(~{got['redone_steps'] * got['step_s']:.1f} s at {got['step_s']:.3f} s/step)",
                flush=True,
            )


if __name__ == "__main__":
    main()
