"""`mt evaluate --hyp` reports exactly what sacrebleu's own API computes on the same files."""

import json

import sacrebleu
from typer.testing import CliRunner

from transformer_mt.cli import app

HYPS = ["The cat sat on the mat.", "A dog runs in the park!", "", "Ein Haus, am See."]
REF1 = ["The cat sat on a mat.", "The dog is running in a park.", "Nothing.", "Ein Haus am See."]
REF2 = ["A cat was sitting on the mat.", "A dog runs through the park!", "", "Das Haus am See."]


def _write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(path)


def test_json_scores_equal_sacrebleu_api_with_two_references(tmp_path):
    hyp = _write(tmp_path / "hyp.txt", HYPS)
    r1, r2 = _write(tmp_path / "r1.txt", REF1), _write(tmp_path / "r2.txt", REF2)
    result = CliRunner().invoke(app, ["evaluate", "--hyp", hyp, "--ref", r1, "--ref", r2, "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    refs = [REF1, REF2]
    assert got["bleu"] == sacrebleu.corpus_bleu(HYPS, refs).score
    assert got["chrf"] == sacrebleu.corpus_chrf(HYPS, refs).score
    assert got["ter"] == sacrebleu.corpus_ter(HYPS, refs).score
    assert got["bleu_signature"].startswith("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp")
    assert "chrF2" in got["chrf_signature"] or "nc:6" in got["chrf_signature"]


def test_plain_output_prints_each_score_with_its_signature(tmp_path):
    hyp = _write(tmp_path / "hyp.txt", HYPS)
    ref = _write(tmp_path / "r1.txt", REF1)
    result = CliRunner().invoke(app, ["evaluate", "--hyp", hyp, "--ref", ref])
    assert result.exit_code == 0, result.output
    bleu = sacrebleu.corpus_bleu(HYPS, [REF1]).score
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"BLEU = {bleu:.2f}") and "tok:13a" in lines[0]
    assert lines[1].startswith("chrF = ") and lines[2].startswith("TER  = ")


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path):
    """Editors on Windows start UTF-8 files with a BOM; it must not cost the first line a word."""
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("\ufeff" + "".join(x + "\n" for x in REF1), encoding="utf-8")
    ref = _write(tmp_path / "r1.txt", REF1)
    result = CliRunner().invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", ref, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bleu"] == sacrebleu.corpus_bleu(REF1, [REF1]).score > 99.9


def test_tokenize_chooses_sacrebleus_bleu_tokenizer(tmp_path):
    """Chinese has no spaces: 13a sees one word a sentence, zh splits the characters."""
    hyps, refs = ["我们 今天 去 公园。", "他喜欢猫"], ["我们今天去公园。", "他喜欢狗"]
    hyp, ref = _write(tmp_path / "hyp.txt", hyps), _write(tmp_path / "ref.txt", refs)
    scores = {}
    for tok in ("13a", "zh"):
        args = ["evaluate", "--hyp", hyp, "--ref", ref, "--json", "--tokenize", tok]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        scores[tok] = json.loads(result.stdout)
        assert scores[tok]["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], tokenize=tok).score
        assert f"|tok:{tok}|" in scores[tok]["bleu_signature"]
    assert scores["zh"]["bleu"] > scores["13a"]["bleu"]


def test_an_unknown_tokenize_fails_before_translating(tmp_path):
    result = CliRunner().invoke(
        app, ["evaluate", "--src", "nope.txt", "-c", "nope.pt", "--ref", "nope", "--tokenize", "x"]
    )
    assert result.exit_code == 1
    assert "--tokenize 'x': expected one of 13a, intl, zh" in result.output
