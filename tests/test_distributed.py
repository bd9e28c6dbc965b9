"""Data-parallel training on two gloo CPU processes, through the real `torchrun` entry point.

The invariant: two processes that each take half of a global batch make exactly the update that
one process makes on the whole batch (here: one process with ``accum_steps=2``), because the loss
is divided by the global token count and DDP's gradient mean is turned back into a sum.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from transformer_mt.config import load_config
from transformer_mt.data.batching import make_batches
from transformer_mt.data.prepare import prepare
from transformer_mt.errors import MTError
from transformer_mt.training import distributed

TIMEOUT_S = 180  # a hang fails the test instead of stalling the suite
# Dropout off: the two layouts draw different random masks, and the comparison is of arithmetic.
FAST = ["model.drop_prob=0", "train.valid_bleu=false", "train.best_metric=loss"]


def _train_cmd(config: Path, run_dir: Path, sets: list[str], nproc: int) -> list[str]:
    launcher = [sys.executable]
    if nproc > 1:
        # --standalone: torchrun starts its own rendezvous on a free port (no hard-coded port).
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = [*launcher, "-m", "transformer_mt", "train", "--config", str(config)]
    cmd += ["--run-dir", str(run_dir), "--no-progress"]
    for item in sets:
        cmd += ["--set", item]
    return cmd


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _even_batch_tokens(config: Path) -> int:
    """A token budget whose epoch has an even number of batches, so that ranks 0 and 1 take
    batches b0 and b1 of each pair unchanged (with an odd count, sharding splits a batch)."""
    cfg = load_config(config)
    data = prepare(cfg, progress=False)  # also fills the cache both runs will use
    for budget in range(cfg.train.batch_tokens, cfg.train.batch_tokens + 200, 8):
        n = len(make_batches(data.train.src_lengths, data.train.trg_lengths + 1, budget, seed=1,
                             epoch=0))  # fmt: skip
        if n % 2 == 0 and n >= 8:
            return budget
    raise AssertionError("no token budget near the config's gives an even batch count")


def test_two_gloo_processes_match_one_process(tmp_path):
    from conftest import TINY_CONFIG

    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=4))
    sets = [*FAST, f"train.batch_tokens={_even_batch_tokens(config)}"]

    one = _run(_train_cmd(config, tmp_path / "one", [*sets, "train.accum_steps=2"], nproc=1))
    assert one.returncode == 0, one.stderr
    two = _run(_train_cmd(config, tmp_path / "two", sets, nproc=2))
    assert two.returncode == 0, two.stderr

    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    # One line per step and validation: a second rank writing too would duplicate them.
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 4]
    for x, y in zip(a, b, strict=True):
        for key in ("loss", "nll", "lr", "val_loss"):
            if key in x:
                assert y[key] == pytest.approx(x[key], abs=1e-5), f"step {x['step']}: {key}"
        if "grad_norm" in x:  # Adam hides a uniform gradient scale from the weights; this does not
            assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4), f"step {x['step']}"
    w1 = torch.load(tmp_path / "one" / "last.pt", weights_only=True)["model"]
    w2 = torch.load(tmp_path / "two" / "last.pt", weights_only=True)["model"]
    for name, value in w1.items():
        diff = (value - w2[name]).abs().max().item()
        assert diff < 1e-5, f"{name} differs by {diff} after 4 steps"
    # Only rank 0 writes: the same files as the single process, and it alone announces the run.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    assert two.stderr.count("training on cpu (2 process(es))") == 1
    ckpt = torch.load(tmp_path / "two" / "last.pt", weights_only=True)
    assert len(ckpt["train_state"]["rng_per_rank"]) == 2, "each rank's dropout stream is saved"


def test_a_failure_on_rank_0_ends_every_rank_with_its_message(tmp_path):
    # A real failure that only rank 0 sees first: it prepares the data while rank 1 waits for it.
    from conftest import TINY_CONFIG

    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=4))
    missing = tmp_path / "nowhere"
    sets = [*FAST, "data.corpus=local"]
    for split in ("train", "valid"):
        sets += [f"data.{split}_src={missing}.src", f"data.{split}_trg={missing}.trg"]
    result = _run(_train_cmd(config, tmp_path / "run", sets, nproc=2))
    assert result.returncode != 0
    assert f"{missing}.src is not a file" in result.stderr
    assert not (tmp_path / "run" / "last.pt").exists()


def _agree_worker(rank: int, store: str, queue) -> None:
    """Rank 1 fails; both ranks must raise, naming rank 1's error."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                         world_size=2)  # fmt: skip
    info = distributed.DistInfo(rank=rank, world_size=2)
    try:
        distributed.agree_on_error(ValueError("disk on fire") if rank == 1 else None, info)
        queue.put((rank, "no error"))
    except (ValueError, MTError) as err:
        queue.put((rank, f"{type(err).__name__}: {err}"))
    finally:
        torch.distributed.destroy_process_group()


def _two_ranks(worker, arg: str) -> dict[int, str]:
    """Run ``worker(rank, arg, queue)`` as ranks 0 and 1 in spawned processes; what each rank
    put on the queue, by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, arg, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
        assert p.exitcode == 0
    return dict(queue.get(timeout=5) for _ in procs)


def test_agree_on_error_raises_on_every_rank(tmp_path):
    # No port at all: a file store in the test's directory is the rendezvous.
    got = _two_ranks(_agree_worker, str(tmp_path / "store"))
    assert got == {0: "MTError: rank 1 failed: disk on fire", 1: "ValueError: disk on fire"}


def test_single_process_helpers_are_no_ops():
    info = distributed.DistInfo()
    assert distributed.all_reduce_sum([1.0, 2.0], info, torch.device("cpu")) == [1.0, 2.0]
    assert distributed.all_gather_objects({"a": 1}, info) == [{"a": 1}]
    assert distributed.main_first(lambda: 7, info) == 7
    distributed.agree_on_error(None, info)
    with pytest.raises(KeyError):
        distributed.agree_on_error(KeyError("x"), info)


def _trainer_rank(rank: int, tmp: str, queue, build_trainer) -> None:
    """As rank ``rank`` of 2 (gloo, a file store in ``tmp``), call ``build_trainer()`` (which
    builds a Trainer); put "no error" or the MTError it raised on the queue."""
    os.environ.update(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank,
                                         world_size=2)  # fmt: skip
    try:
        build_trainer()
        queue.put((rank, "no error"))
    except MTError as err:
        queue.put((rank, str(err)))
    finally:
        torch.distributed.destroy_process_group()


def _fingerprint_worker(rank: int, tmp: str, queue) -> None:
    """Each rank prepares its own copy of the data (as machines without a shared cache do);
    rank 1's toy corpus has another seed, so its tokenizer and batches differ from rank 0's."""
    from conftest import TINY_CONFIG

    from transformer_mt.training.trainer import Trainer

    def build() -> None:
        config = Path(tmp) / f"c{rank}.yaml"
        config.write_text(TINY_CONFIG.format(cache=f"{tmp}/cache{rank}", steps=4))
        cfg = load_config(config, [f"data.toy_seed={1 + rank}"])
        data = prepare(cfg, progress=False)
        Trainer(cfg, Path(tmp) / "run", resume=False, progress=False, data=data)

    _trainer_rank(rank, tmp, queue, build)


def test_ranks_that_prepared_different_data_all_stop_before_training(tmp_path):
    got = _two_ranks(_fingerprint_worker, str(tmp_path))
    for rank in (0, 1):
        assert got[rank].startswith("ranks [1] prepared other data or tokenizers than rank 0"), got
    assert not (tmp_path / "run" / "last.pt").exists()


def _own_run_dir_worker(rank: int, tmp: str, queue) -> None:
    """Machines that do not share the run directory: rank 0 sees the run's last.pt (step 4),
    rank 1 an empty directory of its own."""
    from transformer_mt.training.trainer import Trainer

    cfg = load_config(Path(tmp) / "c.yaml", ["train.max_steps=8"])
    _trainer_rank(rank, tmp, queue, lambda: Trainer(cfg, Path(tmp) / f"run{rank}", progress=False))


def test_ranks_that_would_resume_from_different_steps_stop_before_training(tmp_path):
    from conftest import TINY_CONFIG

    from transformer_mt.training.trainer import Trainer

    (tmp_path / "c.yaml").write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=4))
    Trainer(load_config(tmp_path / "c.yaml"), tmp_path / "run0", progress=False).run()
    before = (tmp_path / "run0" / "last.pt").read_bytes()
    got = _two_ranks(_own_run_dir_worker, str(tmp_path))
    for rank in (0, 1):
        assert got[rank].startswith(
            "rank 1 resumes another run state (step 0) than rank 0 (step 4): the ranks see"
        ), got
        assert "put --run-dir on storage that every machine shares" in got[rank]
    assert (tmp_path / "run0" / "last.pt").read_bytes() == before


def _dead_peer_worker(rank: int, store: str, queue) -> None:
    """Rank 1 dies after joining; rank 0's all-reduce fails, and a SIGTERM (torchrun stopping
    the group to restart it) arrives while it waits to learn who failed."""
    import signal
    import time

    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                         world_size=2)  # fmt: skip
    torch.distributed.barrier()
    if rank == 1:
        os._exit(0)  # no goodbye: as a SIGKILLed worker
    seen: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))  # the stop flag's
    info = distributed.DistInfo(rank=0, world_size=2, timeout_s=60.0)
    queue.put("ready")
    started = time.monotonic()
    try:
        distributed.all_reduce_sum([1.0], info, torch.device("cpu"))
        queue.put(("no error", 0.0, seen))
    except MTError as err:
        queue.put((str(err), time.monotonic() - started, seen))
    finally:
        torch.distributed.destroy_process_group()


def test_a_stop_signal_cuts_the_wait_to_name_a_dead_rank_short(tmp_path):
    import signal
    import time

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_dead_peer_worker, args=(r, str(tmp_path / "s"), queue))
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    assert queue.get(timeout=TIMEOUT_S) == "ready"
    time.sleep(3)  # rank 0 now waits (up to 30 s) for the other ranks to report
    os.kill(procs[0].pid, signal.SIGTERM)
    message, took, seen = queue.get(timeout=TIMEOUT_S)
    for p in procs:
        p.join(TIMEOUT_S)
        assert p.exitcode == 0
    assert message.startswith("another rank left the all-reduce of a step's sums (rank 0 saw:")
    assert "it died or was killed" in message
    assert took < distributed.DIAGNOSE_TIMEOUT_S / 2, f"took {took:.1f} s"
    assert seen == [signal.SIGTERM], "the signal still reaches the handler that was in place"
