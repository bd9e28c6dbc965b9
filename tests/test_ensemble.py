"""Ensembles: an ensemble of one model, or of a model with itself, decodes exactly as that model;
an ensemble of two different models scores each step with the mean of their log-probs (checked
against teacher-forced passes of each model), keeps one cache per model that follows the search
(cache = no cache), and needs models that share tokenizers and vocabularies."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional

from transformer_mt.config import Config, DecodeConfig
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerSettings
from transformer_mt.decoding import (
    DecodeResult,
    Ensemble,
    beam_search,
    check_ensemble,
    decode_sources,
    greedy_search,
    sample,
)
from transformer_mt.engines import translate_lines
from transformer_mt.engines.lines import ensemble_model
from transformer_mt.engines.loading import LoadedModel
from transformer_mt.errors import MTError
from transformer_mt.model import Transformer

VOCAB = 16
LEN = DecodeConfig(max_len_a=2.0, max_len_b=1.0)


def _model(seed: int, vocab: int = VOCAB, **kw) -> Transformer:
    torch.manual_seed(seed)
    args = dict(d_model=32, n_head=4, max_len=64, ffn_hidden=64, n_layers=2, drop_prob=0.1)
    args.update(kw)
    return Transformer(PAD_ID, PAD_ID, BOS_ID, vocab, vocab, **args, tie_embeddings=False).eval()


@pytest.fixture(scope="module")
def model_a() -> Transformer:
    return _model(0)


@pytest.fixture(scope="module")
def model_b() -> Transformer:
    return _model(5, pre_norm=True, n_dec_layers=1)


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    """Eight sources of 3-12 pieces (EOS included), padded: (8, 12)."""
    from conftest import random_sources

    return random_sources(VOCAB)


def _run(kind: str, model, src: torch.Tensor, use_cache: bool = True) -> list[DecodeResult]:
    if kind == "greedy":
        return greedy_search(model, src, LEN, use_cache=use_cache)
    if kind == "beam":
        decode = dataclasses.replace(LEN, beam_size=4, nbest=3, len_penalty=0.6)
        return beam_search(model, src, decode, use_cache=use_cache)
    decode = dataclasses.replace(LEN, sampling=True, top_k=6, sample_seed=2)
    return sample(model, src, decode)


def _toks(results: list[DecodeResult]) -> list[list[list[int]]]:
    return [[h.tokens for h in r.nbest] for r in results]


def _scores(results: list[DecodeResult]) -> list[float]:
    return [h.score for r in results for h in r.nbest]


@pytest.mark.parametrize(
    ("kind", "use_cache"),
    [("greedy", True), ("greedy", False), ("beam", True), ("beam", False), ("sampling", True)],
)
@pytest.mark.parametrize("members", [1, 2])
def test_ensemble_of_one_or_of_itself_equals_the_model(members, kind, use_cache, model_a, src):
    alone = _run(kind, model_a, src, use_cache)
    together = _run(kind, Ensemble([model_a] * members), src, use_cache)
    assert _toks(together) == _toks(alone)
    assert _scores(together) == pytest.approx(_scores(alone), abs=1e-5)


def _teacher_forced_log_probs(model: Transformer, src: torch.Tensor, trg: torch.Tensor):
    """Log-probs (B, T, V) of a model's teacher-forced pass, PAD and BOS at -inf as search has."""
    with torch.inference_mode():
        log_probs = functional.log_softmax(model(src, trg).float(), dim=-1)
        log_probs[..., PAD_ID] = float("-inf")
        log_probs[..., BOS_ID] = float("-inf")
    return log_probs


def test_two_models_average_their_log_probs(model_a, model_b, src):
    ensemble = Ensemble([model_a, model_b])
    # One step of the ensemble's decoder state on given prefixes = the mean of the two models.
    trg = torch.cat([torch.full((8, 1), BOS_ID), torch.randint(4, VOCAB, (8, 4))], dim=1)
    with torch.inference_mode():
        state = ensemble.start(src, use_cache=False)
        got = state.log_probs(trg)  # (8, V)
    mean = (
        _teacher_forced_log_probs(model_a, src, trg) + _teacher_forced_log_probs(model_b, src, trg)
    ) / 2
    torch.testing.assert_close(got, mean[:, -1], atol=1e-5, rtol=0)

    # The greedy outputs differ from each model's, and each score is the sum of mean log-probs.
    results = greedy_search(ensemble, src, dataclasses.replace(LEN, len_penalty=0.0))  # raw sums
    assert _toks(results) != _toks(greedy_search(model_a, src, LEN))
    assert _toks(results) != _toks(greedy_search(model_b, src, LEN))
    for i, res in enumerate(results):
        hyp = res.nbest[0]
        out = [*hyp.tokens, EOS_ID] if hyp.finished else hyp.tokens
        one_src, one_trg = src[i : i + 1], torch.tensor([[BOS_ID, *out[:-1]]])
        mean = (
            _teacher_forced_log_probs(model_a, one_src, one_trg)
            + _teacher_forced_log_probs(model_b, one_src, one_trg)
        ) / 2  # (1, T, V)
        want = mean[0].gather(1, torch.tensor(out)[:, None]).sum().item()
        assert hyp.score == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_each_model_cache_follows_the_search(kind, model_a, model_b, src):
    ensemble = Ensemble([model_a, model_b])
    cached, full = _run(kind, ensemble, src), _run(kind, ensemble, src, use_cache=False)
    assert _toks(cached) == _toks(full)
    assert _scores(cached) == pytest.approx(_scores(full), abs=1e-4)


def test_ensemble_with_prefixes_and_batches(model_a, model_b, src):
    ensemble = Ensemble([model_a, model_b])
    sources = [row[row != PAD_ID].tolist() for row in src]
    prefixes = [[5, 6], [], [7], [8, 9, 10], [], [11], [4, 4], []]
    decode = dataclasses.replace(LEN, beam_size=3, nbest=2, batch_tokens=30)
    results = decode_sources(ensemble, sources, decode, prefixes=prefixes)
    for i, (res, prefix) in enumerate(zip(results, prefixes, strict=True)):
        assert all(h.tokens[: len(prefix)] == prefix for h in res.nbest)
        alone = beam_search(ensemble, src[i : i + 1], decode, prefixes=[prefix])
        assert _toks([res]) == _toks(alone)


def test_ensemble_properties(model_a):
    short = _model(1, max_len=20)
    ensemble = Ensemble([model_a, short])
    assert ensemble.positions.max_len == 20 and len(ensemble) == 2
    assert next(ensemble.parameters()) is next(model_a.parameters())
    short.train()
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        greedy_search(ensemble, torch.tensor([[5, EOS_ID]]), LEN)
    ensemble.eval()
    assert not short.training
    with pytest.raises(ValueError, match="target vocabulary"):
        Ensemble([model_a, _model(1, vocab=VOCAB + 1)])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])


def _tokenizer(words: str, size: int) -> Tokenizer:
    gen = torch.Generator().manual_seed(0)
    vocab = words.split()
    texts = [
        " ".join(vocab[int(i)] for i in torch.randint(len(vocab), (6,), generator=gen))
        for _ in range(200)
    ]
    return Tokenizer.train(texts, TokenizerSettings(vocab_size=size))


@pytest.fixture(scope="module")
def toks() -> tuple[Tokenizer, Tokenizer]:
    return (
        _tokenizer("the a cat dog sat ran on under big small red house", 40),
        _tokenizer("der die das katze hund lief auf unter gross klein rot haus", 42),
    )


def test_check_ensemble_names_the_models_that_differ(toks):
    en, de = toks
    m1, m2 = _model(0, vocab=en.vocab_size), _model(1, vocab=en.vocab_size)
    check_ensemble(["a.pt", "b.pt"], [m1, m2], [de, de], [en, en])  # same: no error
    with pytest.raises(MTError, match=r"^a\.pt and c\.pt have different target sentencepiece"):
        check_ensemble(["a.pt", "b.pt", "c.pt"], [m1, m2, m2], [de] * 3, [en, en, de])
    with pytest.raises(MTError, match=r"^a\.pt and b\.pt have different source sentencepiece"):
        check_ensemble(["a.pt", "b.pt"], [m1, m2], [de, en], [en, en])
    wide = _model(2, vocab=en.vocab_size + 8)  # e.g. a joint vocabulary (share_embeddings)
    with pytest.raises(MTError, match=r"^a\.pt and b\.pt have different output vocab"):
        check_ensemble(["a.pt", "b.pt"], [m1, wide], [de, de], [en, en])
    with pytest.raises(MTError) as err:
        check_ensemble(["a.pt", "b.pt"], [m1, m2], [de, de], [en, de])
    assert "\n" not in str(err.value)


def test_translate_lines_with_an_ensemble(toks):
    en, _ = toks
    v = en.vocab_size
    loaded = [
        LoadedModel(_model(s, vocab=v), en, en, Config(), 0) for s in (0, 0, 1)
    ]  # the first two: the same weights
    assert ensemble_model(loaded[:1], ["a.pt"]) is loaded[0].model
    lines = ["the cat sat on the red house", "", "a dog ran"]
    decode = DecodeConfig(beam_size=3, nbest=2, max_len_a=4.0, max_len_b=1.0)
    alone = translate_lines(loaded[0].model, en, en, lines, decode)
    same = ensemble_model(loaded[:2], ["a.pt", "b.pt"])
    assert isinstance(same, Ensemble)
    got = translate_lines(same, en, en, lines, decode)
    assert [[t for t, _ in r] for r in got] == [[t for t, _ in r] for r in alone]
    mixed = translate_lines(ensemble_model(loaded, ["a.pt", "b.pt", "c.pt"]), en, en, lines, decode)
    assert len(mixed) == 3 and mixed[1] == [("", 0.0)] * 2
    with pytest.raises(MTError, match="one checkpoint"):
        translate_lines(same, en, en, lines, decode, attention_dir="unused")


def test_mt_translate_with_two_checkpoints_and_a_prefix_file(tmp_path):
    """The CLI: `-c a -c a` equals `-c a`; `--prefix-file` starts every output with its line."""
    from pathlib import Path

    from typer.testing import CliRunner

    from transformer_mt.cli import app

    fixture = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
    runner = CliRunner()
    ckpt, src = str(fixture / "old_last.pt"), fixture / "src.txt"
    args = ["translate", "-i", str(src), "--beam", "3"]
    alone = runner.invoke(app, [*args, "-c", ckpt])
    twice = runner.invoke(app, [*args, "-c", ckpt, "-c", ckpt])
    assert twice.exit_code == 0, twice.output
    assert twice.stdout == alone.stdout
    lines = src.read_text(encoding="utf-8").splitlines()
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("".join("Di stair\n" if i % 2 else "\n" for i in range(len(lines))))
    forced = runner.invoke(app, [*args, "-c", ckpt, "--prefix-file", str(prefixes)])
    assert forced.exit_code == 0, forced.output
    for i, (line, out) in enumerate(zip(lines, forced.stdout.splitlines(), strict=True)):
        if line.strip() and i % 2:
            assert out.startswith("Di stair"), out
    short = tmp_path / "short.txt"
    short.write_text("Di\n")
    bad = runner.invoke(app, [*args, "-c", ckpt, "--prefix-file", str(short)])
    assert bad.exit_code == 1 and "one prefix per input line" in bad.stderr
    ct2 = runner.invoke(app, [*args, "--engine", "ct2", "-c", ckpt, "-c", ckpt])
    assert ct2.exit_code == 1 and "several --checkpoint" in ct2.stderr
