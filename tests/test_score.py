"""`mt score`: forced decoding gives what teacher forcing and training's loss give, whatever the
batching; the line contract of `mt translate` (one line per pair, empty pairs empty, mismatched
counts one error naming both files); text and JSON output."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from transformer_mt.cli import app
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer_mt.decoding.score import PairScore, format_scores, score_pairs
from transformer_mt.engines import load_for_inference
from transformer_mt.training.batches import collate
from transformer_mt.training.loss import label_smoothed_nll

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT, SRC, HYP = FIXTURE / "old_last.pt", FIXTURE / "src.txt", FIXTURE / "expected.beam1.txt"
runner = CliRunner()


@pytest.fixture(scope="module")
def loaded():
    return load_for_inference(CKPT)


@pytest.fixture(scope="module")
def pairs():
    sources = SRC.read_text(encoding="utf-8").splitlines()
    targets = HYP.read_text(encoding="utf-8").splitlines()
    assert len(sources) == len(targets) == 31 and sources[4].strip() == ""
    return sources, targets


@pytest.fixture(scope="module")
def scores(loaded, pairs):
    return score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok, *pairs, batch_tokens=4096)


@torch.no_grad()
def _step_by_step(model, src_ids: list[int], trg_pieces: list[int]) -> float:
    """log p(pieces + EOS | source), one position at a time through the decoder's KV cache (the
    search's path), not the scorer's whole-sequence pass."""
    memory, src_mask = model.encode(torch.tensor([src_ids]))
    cache, total, prev = model.new_cache(), 0.0, BOS_ID
    for want in [*trg_pieces, EOS_ID]:
        logits = model.decode(torch.tensor([[prev]]), memory, src_mask, cache)  # (1, 1, V)
        total += F.log_softmax(logits[0, -1].double(), dim=-1)[want].item()
        prev = want
    return total


def test_one_pair_equals_teacher_forcing_step_by_step(loaded, pairs, scores):
    sources, targets = pairs
    for i in (0, 2):
        src_ids = [*loaded.src_tok.encode(sources[i].strip()), EOS_ID]
        pieces = loaded.trg_tok.encode(targets[i].strip())
        (alone,) = score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok, [sources[i]],
                               [targets[i]])  # fmt: skip
        expected = _step_by_step(loaded.model, src_ids, pieces)
        assert alone.tokens == len(pieces) + 1
        assert alone.logprob == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert scores[i].logprob == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert alone.avg == pytest.approx(expected / (len(pieces) + 1), rel=1e-5)


def test_batching_does_not_change_scores(loaded, pairs, scores):
    alone = score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok, *pairs, batch_tokens=1)
    for a, b in zip(alone, scores, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.tokens == b.tokens
            assert a.logprob == pytest.approx(b.logprob, rel=1e-5, abs=1e-5)


@torch.no_grad()
def test_sum_equals_the_validation_nll_of_training(loaded, pairs, scores):
    """Training's code path: collate's (src, trg_in, trg_out), the model in eval mode,
    label_smoothed_nll with epsilon 0, over the same (non-empty) pairs."""
    sources, targets = pairs
    examples = [
        ([*loaded.src_tok.encode(s.strip()), EOS_ID], loaded.trg_tok.encode(t.strip()))
        for s, t in zip(sources, targets, strict=True)
        if s.strip() and t.strip()
    ]
    src, trg_in, trg_out = collate(examples, np.arange(len(examples)))
    loaded.model.eval()
    _, nll = label_smoothed_nll(loaded.model(src, trg_in), trg_out, PAD_ID, 0.0)
    scored = [s for s in scores if s is not None]
    assert len(scored) == len(examples) == 30
    assert sum(s.tokens for s in scored) == int((trg_out != PAD_ID).sum())
    assert -sum(s.logprob for s in scored) == pytest.approx(nll.item(), rel=1e-4)


def test_empty_pairs_are_scored_empty(loaded):
    got = score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok,
                      ["", "  ", "The cat.", "The dog."], ["Di dat.", "x", "\t", "Di dog."])  # fmt: skip
    assert got[:3] == [None, None, None] and isinstance(got[3], PairScore)
    assert list(format_scores(got)) == ["", "", "", f"{got[3].logprob:.4f}\t{got[3].tokens}"
                                        f"\t{got[3].avg:.4f}"]  # fmt: skip
    assert json.loads(next(format_scores(got, as_json=True))) == {
        "logprob": None, "tokens": 0, "avg": None,
    }  # fmt: skip


def test_over_long_sides_truncated_with_a_warning_not_dropped(loaded):
    """Each side is scored whole while it fits the position table (64 here), else cut to it."""
    long_source = " ".join(["The friend closed the woman."] * 20)
    long_target = " ".join(["Di stair staustaet dan trumenaul."] * 20)
    with pytest.warns(UserWarning) as record:
        got = score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok,
                          [long_source, "The cat."], [long_target, "Di dat."])  # fmt: skip
    messages = [str(w.message) for w in record]
    assert any(m.startswith("line 1: ") and "source pieces" in m for m in messages), messages
    assert any(m.startswith("line 1: ") and "target pieces" in m for m in messages), messages
    assert got[0].tokens == 64 and got[1].tokens == len(loaded.trg_tok.encode("Di dat.")) + 1


def test_greedy_translation_scores_higher_than_a_shuffled_target(pairs, scores, loaded):
    """A sanity check of the model, not a law: its own greedy output should be likelier (per
    token) than another line's translation for most lines."""
    sources, targets = pairs
    shuffled = list(targets)
    random.Random(0).shuffle(shuffled)
    other = score_pairs(loaded.model, loaded.src_tok, loaded.trg_tok, sources, shuffled)
    wins = [s.avg > o.avg for s, o, a, b in zip(scores, other, targets, shuffled, strict=True)
            if s is not None and o is not None and a != b]  # fmt: skip
    assert len(wins) >= 20 and sum(wins) >= 0.8 * len(wins)


def test_cli_text_and_json(tmp_path, scores):
    out = tmp_path / "scores.txt"
    result = runner.invoke(app, ["score", "-c", str(CKPT), "--src", str(SRC), "--trg", str(HYP),
                                 "-o", str(out), "--batch-tokens", "64"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 32 and lines[4] == ""
    logprob, tokens, avg = lines[0].split("\t")
    assert float(logprob) == pytest.approx(scores[0].logprob, abs=1e-4)
    assert int(tokens) == scores[0].tokens and float(avg) == pytest.approx(scores[0].avg, abs=1e-4)

    result = runner.invoke(app, ["score", "-c", str(CKPT), "--src", str(SRC), "--trg", str(HYP),
                                 "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 31 and records[4] == {"logprob": None, "tokens": 0, "avg": None}
    assert records[0]["logprob"] == pytest.approx(scores[0].logprob, rel=1e-6)
    assert set(records[0]) == {"logprob", "tokens", "avg"}


def test_cli_mismatched_counts_is_one_error_naming_both_files(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n", encoding="utf-8")
    result = runner.invoke(app, ["score", "-c", str(CKPT), "--src", str(SRC), "--trg", str(short)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(SRC) in lines[0] and "31" in lines[0] and str(short) in lines[0] and "2" in lines[0]


def test_cli_refuses_to_write_over_an_input(tmp_path):
    trg = tmp_path / "trg.txt"
    trg.write_text(HYP.read_text(encoding="utf-8"), encoding="utf-8")
    before = trg.read_bytes()
    result = runner.invoke(app, ["score", "-c", str(CKPT), "--src", str(SRC), "--trg", str(trg),
                                 "-o", str(trg)])  # fmt: skip
    assert result.exit_code == 1 and result.stderr.startswith("error: ")
    assert trg.read_bytes() == before


def test_an_ensemble_scores_with_the_mean_of_its_models_log_probs():
    """`mt score -c a -c b`: each token's log-probability is the mean over the models."""
    loaded, other = load_for_inference(CKPT), load_for_inference(CKPT)
    with torch.no_grad():  # a second, different model with the same vocabulary
        for p in other.model.parameters():
            p.mul_(0.9)
    src = SRC.read_text(encoding="utf-8").splitlines()[:4]
    trg = HYP.read_text(encoding="utf-8").splitlines()[:4]
    tok = (loaded.src_tok, loaded.trg_tok)
    alone = [score_pairs(m, *tok, src, trg) for m in (loaded.model, other.model)]
    both = score_pairs([loaded.model, other.model], *tok, src, trg)
    for a, b, mean in zip(*alone, both, strict=True):
        assert mean.logprob == pytest.approx((a.logprob + b.logprob) / 2, rel=1e-5)
    args = ["score", "--src", str(SRC), "--trg", str(HYP), "-c", str(CKPT)]
    twice = runner.invoke(app, [*args, "-c", str(CKPT)])
    assert twice.exit_code == 0, twice.output
    assert twice.stdout == runner.invoke(app, args).stdout, "a model with itself: the model"
