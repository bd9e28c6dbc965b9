"""Several machines, played by several torchrun agents on 127.0.0.1 (gloo, CPU).

Each agent is one "node" of one process; the agents meet at a c10d rendezvous on a local port.
The invariants: two such nodes train exactly as one node with two processes; a node may start
late (within the rendezvous's join timeout) and one that never comes ends the job with one line;
under ``--max-restarts`` a SIGKILLed worker brings the group back from last.pt and the finished
run equals an uninterrupted one; SIGTERM to the launchers saves a checkpoint. The launch scripts of scripts/slurm/ are shell-checked here too.

The slow tests run with ``make test-slow`` (or ``make test-cluster``: this file alone).
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_distributed import FAST, _metrics

from transformer_mt.training.distributed import FRESH_STORE_ENV

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240  # a hang fails the test instead of stalling the suite
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
LAUNCHER = [sys.executable, "-m", "transformer_mt.training.distributed"]  # torchrun, made safe
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, steps: int) -> Path:
    from conftest import TINY_CONFIG

    from transformer_mt.config import load_config
    from transformer_mt.data.prepare import prepare

    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=steps))
    prepare(load_config(config), progress=False)  # the shared cache every node then reads
    return config


def _train_args(config: Path, run_dir: Path, sets: list[str]) -> list[str]:
    args = ["-m", "transformer_mt", "train", "--config", str(config), "--run-dir", str(run_dir)]
    return [*args, "--no-progress", *[a for item in sets for a in ("--set", item)]]


def _node(launcher: list[str], port: int, *extra: str) -> list[str]:
    """One agent of a 2-node job whose rendezvous is on 127.0.0.1:``port``."""
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t"]
    return [*launcher, "--nnodes", "2", "--nproc-per-node", "1", *rdzv, *extra]


def _start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # A session of its own: a hung agent is killed with its workers (see _finish).
    return subprocess.Popen(cmd, env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """Each process's exit status and output; any still running after the timeout is killed,
    with its workers."""
    try:
        outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # also the workers left of an ended agent
            p.communicate()


def _same_run(a: Path, b: Path) -> None:
    """Runs ``a`` and ``b`` logged the same numbers at the same steps and ended with the same
    weights, bit for bit."""
    x, y = _metrics(a), _metrics(b)
    assert [r["step"] for r in x] == [r["step"] for r in y]
    for p, q in zip(x, y, strict=True):
        for key in ("loss", "nll", "lr", "grad_norm", "val_loss"):
            if key in p:
                assert p[key] == q[key], f"step {p['step']}: {key} {p[key]} != {q[key]}"
    w = torch.load(a / "last.pt", weights_only=True)["model"]
    v = torch.load(b / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(w[k], v[k]) for k in w)


def test_two_nodes_train_as_one_node_with_two_processes(tmp_path):
    # Dropout on: rank r draws the same masks wherever it runs, so the runs must match exactly.
    config, sets = _config(tmp_path, steps=4), FAST
    one = _start([*TORCHRUN, "--standalone", "--nproc-per-node", "2",
                  *_train_args(config, tmp_path / "one", sets)])  # fmt: skip
    [(code, out)] = _finish([one])
    assert code == 0, out
    port = _free_port()
    nodes = [_start([*_node(TORCHRUN, port), *_train_args(config, tmp_path / "two", sets)])]
    nodes.append(_start([*_node(TORCHRUN, port), *_train_args(config, tmp_path / "two", sets)]))
    for code, out in _finish(nodes):
        assert code == 0, out
    assert [r["step"] for r in _metrics(tmp_path / "two")] == [1, 2, 3, 4, 4]
    _same_run(tmp_path / "one", tmp_path / "two")


def test_a_node_that_never_comes_ends_the_job_with_one_line(tmp_path):
    config = _config(tmp_path, steps=4)
    cmd = [*_node(LAUNCHER, _free_port(), "--rdzv-conf", "join_timeout=3"),
           *_train_args(config, tmp_path / "run", FAST)]  # fmt: skip
    started = time.monotonic()
    [(code, out)] = _finish([_start(cmd)])
    took = time.monotonic() - started
    assert code == 1
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1].startswith("error: the rendezvous at 127.0.0.1:"), out
    assert "did not gather --nnodes 2 within join_timeout=3 s" in lines[-1]
    assert "Traceback" not in out
    assert not (tmp_path / "run").exists(), "no worker started"
    assert took < 60, f"took {took:.0f} s"


@pytest.mark.slow
def test_failed_workers_end_the_launcher_with_one_line_after_their_own(tmp_path):
    config = _config(tmp_path, steps=4)
    missing = [f"data.{s}_{side}={tmp_path}/nowhere.{side}" for s in ("train", "valid")
               for side in ("src", "trg")]  # fmt: skip
    cmd = [*LAUNCHER, "--standalone", "--nproc-per-node", "2",
           *_train_args(config, tmp_path / "run", [*FAST, "data.corpus=local", *missing])]  # fmt: skip
    [(code, out)] = _finish([_start(cmd)])
    assert code == 1
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert "nowhere.src is not a file" in errors[0], out
    # The first rank to fail exits with 1; its agent may stop the other one with SIGTERM.
    ranks = r"rank \d \((exit code \d+|killed by SIG[A-Z]+)\)"
    assert re.fullmatch(rf"error: the workers failed \({ranks}(, {ranks})*\) after 0 restart\(s\) "
                        r"\(--max-restarts\); each rank's own error line says why",
                        errors[-1]), out  # fmt: skip
    assert "exit code 1" in errors[-1]
    assert "Traceback" not in out


@pytest.mark.slow
def test_a_node_that_starts_late_joins_within_the_join_timeout(tmp_path):
    config = _config(tmp_path, steps=4)
    port = _free_port()
    cmd = [*_node(LAUNCHER, port, "--rdzv-conf", "join_timeout=60"),
           *_train_args(config, tmp_path / "run", FAST)]  # fmt: skip
    first = _start(cmd)
    time.sleep(8)  # the first node is up and waiting at the rendezvous
    assert first.poll() is None, "the first node must still be waiting"
    assert not (tmp_path / "run").exists(), "no worker started with one node of two"
    for code, out in _finish([first, _start(cmd)]):
        assert code == 0, out
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1, 2, 3, 4, 4]


def _lines(path: Path) -> int:
    """Complete lines in ``path`` so far (0 before it exists)."""
    return path.read_text().count("\n") if path.exists() else 0


def _workers(agents: list[subprocess.Popen]) -> dict[int, int]:
    """The agents' worker processes: pid by global rank (from each worker's RANK)."""
    found = {}
    for agent in agents:
        try:
            children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
            for pid in children:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                rank = [e[5:] for e in env if e.startswith(b"RANK=")]
                if rank:
                    found[int(rank[0])] = int(pid)
        except OSError:  # a process that just ended
            continue
    return found


def _kill_rank_after_a_checkpoint(agents: list[subprocess.Popen], run: Path, rank: int) -> None:
    """SIGKILL rank ``rank``'s worker in the middle of training, a step or more past the first
    checkpoint (so that the restart must resume it, and redo the steps since)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        lines = _lines(run / "metrics.jsonl") if (run / "last.pt").exists() else 0
        if lines > 12 and rank in _workers(agents):  # step 11 logged: step 10's save is done
            os.kill(_workers(agents)[rank], signal.SIGKILL)
            return
        assert all(a.poll() is None for a in agents), "an agent ended before the kill"
        time.sleep(0.01)
    raise AssertionError("no checkpoint was written in time")


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0], ids=["rank-1", "rank-0"])
def test_a_killed_worker_restarts_the_group_from_last_pt_and_loses_nothing(tmp_path, rank):
    """Rank 1, or rank 0 (the one that writes checkpoints and holds the run's lock), SIGKILLed
    under --max-restarts 1: every rank resumes from last.pt and the run ends as if uninterrupted."""
    config = _config(tmp_path, steps=60)
    whole = _start([*TORCHRUN, "--standalone", "--nproc-per-node", "2",
                    *_train_args(config, tmp_path / "whole", FAST)])  # fmt: skip
    [(code, out)] = _finish([whole])
    assert code == 0, out

    run = tmp_path / "killed"
    cmd = [*_node(LAUNCHER, _free_port(), "--max-restarts", "1"), *_train_args(config, run, FAST)]
    agents = [_start(cmd), _start(cmd)]
    _kill_rank_after_a_checkpoint(agents, run, rank)
    outputs = _finish(agents)
    for code, out in outputs:
        assert code == 0, out
    out = "".join(o for _, o in outputs)
    assert "exitcode: -9" in out, "the agent saw its worker killed"
    resumed = [line for line in out.splitlines() if line.startswith("resuming ")]
    assert len(resumed) == 1, out  # rank 0 reports; the others are checked to agree with it
    assert any(f"at step {k} " in resumed[0] for k in (10, 20, 30, 40, 50)), resumed
    _same_run(tmp_path / "whole", run)


@pytest.mark.slow
def test_sigterm_to_the_launchers_saves_a_checkpoint_and_exits_143(tmp_path):
    """As Slurm's preemption or scancel does: every agent gets SIGTERM mid-run; the workers save
    after the current step, and each launcher ends with one line and the shell's code."""
    config, run = _config(tmp_path, steps=400), tmp_path / "run"
    cmd = [
        *_node(LAUNCHER, _free_port()),
        *_train_args(config, run, [*FAST, "train.valid_every=100"]),
    ]
    agents = [_start(cmd), _start(cmd)]
    deadline = time.monotonic() + TIMEOUT_S
    while _lines(run / "metrics.jsonl") < 20:
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents)
        time.sleep(0.01)
    for agent in agents:
        agent.send_signal(signal.SIGTERM)
    outputs = _finish(agents)
    for code, out in outputs:
        assert code == 143, out
        assert out.rstrip().splitlines()[-1] == "error: the launcher was stopped by SIGTERM"
    step = torch.load(run / "last.pt", weights_only=True)["step"]
    assert 20 <= step < 100, "saved where it stopped, not at a validation"
    assert f"stopped by signal at step {step}" in "".join(out for _, out in outputs)


def test_the_fresh_store_switch_is_one_this_torch_reads():
    """The launcher's fix for restarts rests on an environment variable of torch's rendezvous:
    if a torch release renames it, restarts read stale addresses again."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    source = Path(dynamic_rendezvous.__file__).read_text()
    for key in FRESH_STORE_ENV:
        assert f'"{key}"' in source, f"this torch no longer reads {key}"


SCRIPTS = sorted((ROOT / "scripts" / "slurm").glob("*.s*"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_cluster_scripts_parse_and_pass_shellcheck(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n passed")
    result = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_there_are_cluster_scripts_to_check():
    assert {p.name for p in SCRIPTS} >= {"train.sbatch", "train_pdsh.sh"}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() == 0, reason="no CUDA GPU visible (torch.cuda.is_available() is False)")
def test_two_steps_on_gpus_with_nccl_bf16_and_compile(tmp_path):
    """The GPU code paths: NCCL (with two GPUs; one GPU runs a single process), bf16 autocast
    and torch.compile, two steps with finite losses and the run announced on cuda."""
    config = _config(tmp_path, steps=2)
    nproc = min(2, _gpus())
    sets = [*FAST, "train.device=cuda", "train.precision=bf16", "train.compile=true"]
    launcher = [*LAUNCHER, "--standalone", "--nproc-per-node", str(nproc)]
    [(code, out)] = _finish([_start([*launcher, *_train_args(config, tmp_path / "run", sets)])])
    assert code == 0, out
    assert re.search(rf"training on cuda(:0)? \({nproc} process\(es\)\)", out), out
    losses = [r["loss"] for r in _metrics(tmp_path / "run") if "loss" in r]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))), losses
