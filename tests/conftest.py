"""Shared fixtures: small models and tokenizers that make tests fast on 2 CPU cores."""

import os
import subprocess
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # tests run many tiny ops: threads only add overhead (and CI has 2 cores)


# The reverse task of the search tests: a tiny model learns to write its source backwards, so that
# it ends its hypotheses with EOS (tests/test_decoding.py, tests/test_constraints.py).
REVERSE_VOCAB = 16  # 4 specials + 12 symbols
REVERSE_MAX_SYMBOLS = 7


def tiny_transformer(seed: int, vocab: int = REVERSE_VOCAB, **kw):
    """A small Transformer (d_model 32, 2 layers) of ``vocab`` pieces a side, seeded."""
    from transformer_mt.data.tokenizer import BOS_ID, PAD_ID
    from transformer_mt.model import Transformer

    torch.manual_seed(seed)
    args = dict(d_model=32, n_head=4, max_len=64, ffn_hidden=64, n_layers=2, drop_prob=0.1)
    args.update(kw)
    return Transformer(PAD_ID, PAD_ID, BOS_ID, vocab, vocab, **args, tie_embeddings=False)


def reverse_batch(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources ``x EOS`` and targets ``BOS reversed(x) EOS``, padded: (n, S), (n, S + 1)."""
    from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

    lens = torch.randint(2, REVERSE_MAX_SYMBOLS + 1, (n,), generator=gen).tolist()
    src = torch.full((n, REVERSE_MAX_SYMBOLS + 1), PAD_ID)
    trg = torch.full((n, REVERSE_MAX_SYMBOLS + 2), PAD_ID)
    for i, length in enumerate(lens):
        seq = torch.randint(4, REVERSE_VOCAB, (length,), generator=gen)
        src[i, :length], src[i, length] = seq, EOS_ID
        trg[i, 0], trg[i, 1 : length + 1], trg[i, length + 1] = BOS_ID, seq.flip(0), EOS_ID
    return src, trg


def reverse_model(steps: int):
    """A model trained ``steps`` steps on the reverse task, in eval mode.

    The learning rate decays to 0 so that the end point is stable (no late Adam spike)."""
    from torch.nn import functional

    model = tiny_transformer(1, d_model=64, ffn_hidden=128, drop_prob=0.0, pre_norm=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, 2.0 * (steps - i) / steps))
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src, trg = reverse_batch(gen, 64)
        logits = model(src, trg[:, :-1])  # (B, T, V)
        loss = functional.cross_entropy(
            logits.reshape(-1, REVERSE_VOCAB), trg[:, 1:].reshape(-1), ignore_index=0
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def shared_multi30k() -> Path | None:
    """The Multi30k files of ../shared (or $MT_SHARED_DATA), or None when absent."""
    env = os.environ.get("MT_SHARED_DATA")
    candidates = [Path(env), Path(env) / "multi30k"] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k")
    for c in candidates:
        if (c / "train.de.gz").is_file():
            return c
    return None


def run_together(commands: list[list[str]], timeout: float = 300) -> list[tuple[int, str]]:
    """Run processes that print "ready" once set up and then wait for a line on stdin; start
    their real work at the same moment (after every one's imports). Returns each one's (exit
    status, output after "ready", stderr included)."""
    procs = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert ready == "ready\n", ready + proc.communicate(timeout=timeout)[0]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return [(proc.returncode, out) for proc, out in zip(procs, outputs, strict=True)]


def random_sources(vocab: int) -> torch.Tensor:
    """Eight sources of 3-12 random pieces (ids 4 .. vocab-1, then EOS), right-padded: (8, 12)."""
    from transformer_mt.data.tokenizer import EOS_ID, PAD_ID

    gen = torch.Generator().manual_seed(3)
    src = torch.full((8, 12), PAD_ID)
    for i, length in enumerate([12, 3, 7, 12, 5, 9, 4, 10]):
        src[i, : length - 1] = torch.randint(4, vocab, (length - 1,), generator=gen)
        src[i, length - 1] = EOS_ID
    return src


@pytest.fixture
def tiny_model_args() -> dict:
    return dict(
        src_pad_idx=0, trg_pad_idx=0, trg_sos_idx=2, enc_voc_size=40, dec_voc_size=40,
        d_model=32, n_head=4, max_len=64, ffn_hidden=64, n_layers=2, drop_prob=0.1,
    )  # fmt: skip


TINY_CONFIG = """\
name: tiny
data:
  corpus: toy
  toy_train_size: 400
  toy_valid_size: 20
  toy_test_size: 20
  max_tokens_per_side: 48
  cache_dir: {cache}
tokenizer:
  vocab_size: 300
model:
  d_model: 32
  n_head: 2
  ffn_hidden: 64
  n_layers: 1
  max_len: 64
train:
  max_steps: {steps}
  batch_tokens: 400
  warmup_steps: 10
  log_every: 1
  valid_every: 10
  keep_last: 1
  threads: 1
  precision: fp32  # runs that tests compare must not hang on a timing probe (train.precision=auto)
decode:
  beam_size: 2
  max_len_a: 5
  max_len_b: 1.2
  precision: fp32
"""


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    """A YAML config that trains a tiny model on 400 toy pairs in seconds."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG.format(cache=tmp_path / "cache", steps=20))
    return path
