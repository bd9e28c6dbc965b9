"""Shared fixtures: small models and tokenizers that make tests fast on 2 CPU cores."""

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)  # tests run many tiny ops: threads only add overhead (and CI has 2 cores)


def shared_multi30k() -> Path | None:
    """The Multi30k files of ../shared (or $MT_SHARED_DATA), or None when absent."""
    env = os.environ.get("MT_SHARED_DATA")
    candidates = [Path(env), Path(env) / "multi30k"] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k")
    for c in candidates:
        if (c / "train.de.gz").is_file():
            return c
    return None


@pytest.fixture
def tiny_model_args() -> dict:
    return dict(
        src_pad_idx=0, trg_pad_idx=0, trg_sos_idx=2, enc_voc_size=40, dec_voc_size=40,
        d_model=32, n_head=4, max_len=64, ffn_hidden=64, n_layers=2, drop_prob=0.1,
    )  # fmt: skip
