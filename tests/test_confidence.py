"""The model's confidence in a translation: the log-probability the search kept for each
hypothesis, equal to forced decoding's, summed over a paragraph's sentences, and the server's
`confidence` field."""

import dataclasses
import math
from pathlib import Path

import pytest

from transformer_mt.engines.engine import load_engine
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.engines.results import LineResult

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_checkpoint"
CKPT = FIXTURE / "old_last.pt"
LINES = ["The horse pulls the mouse.", "The friend closed the woman.", "", "🙂"]


@pytest.fixture(scope="module")
def engine():
    return load_engine("torch", CKPT)


def test_each_hypothesis_log_probability_is_forced_decodings(engine):
    decode = dataclasses.replace(engine.run_decode, beam_size=3, nbest=2)
    results = engine.translate(LINES, decode)
    for result in results[:2]:
        assert len(result.logprobs) == 2
        texts = [text for text, _ in result.nbest]
        forced = engine.score([LINES[results.index(result)]] * 2, texts, 4096)
        for (logp, pieces), pair in zip(result.logprobs, forced, strict=True):
            assert logp == pytest.approx(pair.logprob, abs=1e-3) and pieces == pair.tokens
        best = result.confidences()[0]
        assert best == round(100 * math.exp(forced[0].logprob / forced[0].tokens), 2)
        assert 0 < best <= 100
    assert results[2].logprobs is None and results[3].confidences() is None  # not decoded


def test_a_paragraph_sums_its_sentences(engine):
    decode = engine.run_decode
    alone = engine.translate(LINES[:2], decode)
    text = " ".join(LINES[:2]) + " 🙂"
    [joined] = engine.translate([text], decode, extras=TranslateExtras(split=True))
    assert joined.logprobs == [
        (
            pytest.approx(sum(r.logprobs[0][0] for r in alone), abs=1e-4),
            sum(r.logprobs[0][1] for r in alone),
        )
    ]


def test_confidence_is_the_geometric_mean_of_the_pieces_probabilities():
    result = LineResult("a b", -1.0, [("a b", -1.0)], logprobs=[(math.log(0.25) * 2, 2)])
    assert result.confidences() == [25.0]
    assert LineResult("a", 0.0, [("a", 0.0)]).confidences() is None


def test_the_server_gives_confidences_when_asked(engine):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
    from test_serve import LIMITS, running

    from transformer_mt.serve.app import create_app

    with running(create_app(engine, LIMITS)) as url, httpx.Client(base_url=url) as client:
        body = {"q": LINES, "source": "src", "target": "trg", "alternatives": 1}
        plain = client.post("/translate", json=body).json()
        assert "confidence" not in plain  # LibreTranslate's reply unless asked
        reply = client.post("/translate", json={**body, "confidence": True}).json()
    decode = dataclasses.replace(engine.decode, beam_size=max(engine.decode.beam_size, 2), nbest=2)
    want = [r.confidences() for r in engine.translate(LINES, decode)]
    assert reply["translatedText"] == plain["translatedText"]
    assert reply["confidence"] == [w[0] if w else None for w in want]
    assert reply["alternativesConfidence"] == [w[1:] if w else [] for w in want]
