"""A checkpoint written by an older version loads and translates exactly as it did then.

The fixture (tests/fixtures/old_checkpoint, see its README) holds the old code's own outputs; the
current code must reproduce them: same text, same n-best scores, same sampled draws, same
cross-attention weights.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.engines import load_for_inference
from transformer_mt.engines.attention import attention_matrices

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
runner = CliRunner()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--beam", "1"], "expected.beam1.txt"),
        (["--beam", "3", "--nbest", "2"], "expected.beam3.nbest2.txt"),
        (["--sample", "--seed", "7"], "expected.sample.txt"),
    ],
)
def test_old_checkpoint_translates_as_the_old_code_did(tmp_path, options, expected):
    out = tmp_path / "out.txt"
    args = ["translate", "-c", str(FIXTURE / "old_last.pt"), "-i", str(FIXTURE / "src.txt")]
    result = runner.invoke(app, [*args, "-o", str(out), *options])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == (FIXTURE / expected).read_text(encoding="utf-8")


def test_old_checkpoint_gives_the_old_cross_attention():
    loaded = load_for_inference(FIXTURE / "old_last.pt")
    arrays = np.load(FIXTURE / "expected_attention.npz")
    for record in json.loads((FIXTURE / "expected_attention.json").read_text()):
        line = (
            (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()[record["src_line_index"]]
        )
        src_ids = [*loaded.src_tok.encode(line.strip()), EOS_ID]
        assert src_ids == record["src_ids"]
        hyp = _greedy(loaded, src_ids)
        assert hyp.tokens == record["hyp_ids"] and hyp.finished == record["finished"]
        assert hyp.score == pytest.approx(record["score"], abs=1e-5)
        src = torch.tensor([src_ids])
        (weights,) = attention_matrices(loaded.model, src, [hyp])
        np.testing.assert_allclose(weights, arrays[record["key"]], atol=1e-6)


def _greedy(loaded, src_ids):
    import dataclasses

    from transformer_mt.decoding import greedy_search

    decode = dataclasses.replace(loaded.config.decode, beam_size=1, nbest=1)
    return greedy_search(loaded.model, torch.tensor([src_ids]), decode)[0].nbest[0]
