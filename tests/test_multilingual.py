"""One model, several language pairs: tags, temperature sampling, validation per pair.

What is proved: with several target languages each training source starts with its target's tag
(one piece of the tokenizer, never split, never in a target and never in decoded text), a model
with one target has none; an epoch draws each language pair as the temperature formula says;
validation reports loss and BLEU per pair and their mean; a validation pair no training source
has is refused; and (slow) the toy recipe's two-target model scores within 3 BLEU of a one-pair
model of the same size and steps on each target.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_prepare import _pairs

from transformer_mt.config import load_config
from transformer_mt.data import prepare as prep
from transformer_mt.data.languages import lang_tag, target_tags
from transformer_mt.data.mixing import MixedCorpus
from transformer_mt.data.prepare import temperature_weights
from transformer_mt.errors import MTError


def _shifted(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A second target language: each target word reversed and capitalized."""
    return [(s, " ".join(w[::-1].capitalize() for w in t.split())) for s, t in pairs]


def _write(path: Path, pairs: list[tuple[str, str]]) -> str:
    for side, suffix in ((0, "src"), (1, "trg")):
        path.with_suffix(f".{suffix}").write_text("".join(p[side] + "\n" for p in pairs))
    return f"{{src: {path.with_suffix('.src')}, trg: {path.with_suffix('.trg')}"


@pytest.fixture
def two_targets(tmp_path: Path) -> Path:
    """A config with xx->yy (300 pairs) and xx->zz (the first 100 of the same sources),
    validation for both: only the tag tells the model which target to write."""
    pairs = _pairs(360, 1)  # one vocabulary: the last 60 are held out
    yy, zz = pairs[:300], _shifted(pairs[:100])
    v_yy, v_zz = pairs[300:320], _shifted(pairs[300:320])
    config = tmp_path / "multi.yaml"
    config.write_text(
        "name: multi\ndata:\n  src_lang: xx\n  trg_lang: yy\n"
        f"  cache_dir: {tmp_path / 'cache'}\n  max_tokens_per_side: 48\n"
        "  train:\n"
        f"    - {_write(tmp_path / 'yy', yy)}}}\n"
        f"    - {_write(tmp_path / 'zz', zz)}, trg_lang: zz}}\n"
        "  valid:\n"
        f"    - {_write(tmp_path / 'vyy', v_yy)}}}\n"
        f"    - {_write(tmp_path / 'vzz', v_zz)}, trg_lang: zz}}\n"
        "tokenizer:\n  vocab_size: 200\n"
        "model:\n  d_model: 32\n  n_head: 2\n  ffn_hidden: 64\n  n_layers: 1\n  max_len: 64\n"
        "train:\n  max_steps: 6\n  batch_tokens: 400\n  warmup_steps: 4\n  valid_every: 3\n"
        "  log_every: 3\n  threads: 1\n"
    )
    return config


def test_each_source_starts_with_its_targets_tag_a_single_piece(two_targets):
    cfg = load_config(two_targets)
    assert target_tags(cfg.data) == {"yy": "<2yy>", "zz": "<2zz>"}
    data = prep.prepare(cfg, progress=False)
    tok = data.src_tok
    tags = {lang: tok.piece_id(lang_tag(lang)) for lang in ("yy", "zz")}
    assert None not in tags.values()
    assert tok.id_to_piece([tags["zz"]]) == ["<2zz>"], "the tag is one piece, never split"
    assert tags["zz"] not in tok.encode("abc <2zz> abc"), "text is never cut into a tag"
    assert isinstance(data.train, MixedCorpus)
    for part, lang in zip(data.train.parts, ("yy", "zz"), strict=True):
        firsts = {int(part[i][0][0]) for i in range(len(part))}
        assert firsts == {tags[lang]}, f"every {lang} source starts with <2{lang}>"
        targets = np.concatenate([part[i][1] for i in range(len(part))])
        assert not set(targets.tolist()) & set(tags.values()), "no tag is ever a target"
    assert [vs.name for vs in data.valid_sets] == ["xx-yy", "xx-zz"]
    assert [vs.prefix for vs in data.valid_sets] == [(tags["yy"],), (tags["zz"],)]
    assert tok.decode([tags["zz"], *tok.encode("abc def")]) == "abc def", "decode drops tags"


def test_a_model_with_one_target_has_no_tags(tmp_path):
    yy = _pairs(50, 1)
    cfg = load_config(
        None,
        [
            f"data.train=[{_write(tmp_path / 'a', yy)}}}, {_write(tmp_path / 'b', yy)}, src_lang: ww}}]",
            f"data.valid={_write(tmp_path / 'v', yy[:5])}}}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "tokenizer.vocab_size=100",
        ],
    )
    assert target_tags(cfg.data) == {}, "many-to-one: the sources need no tag"


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0])
def test_an_epoch_draws_each_pair_as_the_temperature_formula_says(temperature):
    sizes, weights = [9000, 1000, 500, 500], [1.0, 1.0, 2.0, 1.0]
    pairs = [("xx", "yy"), ("xx", "zz"), ("xx", "ww"), ("xx", "ww")]
    w = temperature_weights(sizes, weights, pairs, temperature)

    class Part:  # a binarized source of n pairs, as far as the mixing reads it
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

    mixed = MixedCorpus([Part(n) for n in sizes], w, seed=1)  # type: ignore[misc]
    counts = np.bincount(mixed.source_of(mixed.chosen(0)), minlength=4)
    per_pair = [counts[0], counts[1], counts[2] + counts[3]]
    mass = [9000, 1000, 1000 + 500]  # weight x size of each pair
    p = np.array(mass) / sum(mass)
    q = p ** (1 / temperature) / (p ** (1 / temperature)).sum()
    total = sum(mass)  # the epoch keeps its size: only the shares move
    for got, want in zip(per_pair, q * total, strict=True):
        assert abs(got - want) <= 0.02 * want
    assert counts[2] == pytest.approx(2 * counts[3], abs=1), "within a pair, weights hold"
    if temperature > 1:
        assert per_pair[1] > 1000, "a higher temperature draws more of the small pairs"


def test_validation_reports_each_pair_and_their_mean(two_targets, tmp_path):
    from transformer_mt.training.trainer import Trainer

    cfg = load_config(two_targets)
    Trainer(cfg, tmp_path / "run", progress=False).run()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in lines if "val_loss" in r]
    assert valid, "the run validated"
    for r in valid:
        for key in ("val_loss", "val_bleu"):
            per_pair = [r[f"{key}/xx-yy"], r[f"{key}/xx-zz"]]
            assert r[key] == pytest.approx(sum(per_pair) / 2)
        assert r["val_loss/xx-yy"] != r["val_loss/xx-zz"]


def test_a_validation_pair_that_no_source_trains_is_refused(two_targets):
    text = two_targets.read_text().replace("trg_lang: zz}\n  valid", "}\n  valid", 1)
    two_targets.write_text(text)
    with pytest.raises(MTError, match=r"data.valid has xx-zz, which no training source has"):
        prep.prepare(load_config(two_targets), progress=False)


# --- using a multilingual model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A two-target model (xx->yy, xx->zz) trained for 300 steps; its run directory."""
    from transformer_mt.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("multi")
    config = two_targets.__wrapped__(tmp)  # the fixture's body, for a module-wide model
    text = config.read_text()
    for before, after in (
        ("max_steps: 6", "max_steps: 300"),
        ("valid_every: 3", "valid_every: 300"),
        ("warmup_steps: 4", "warmup_steps: 50"),
        ("log_every: 3", "log_every: 50"),
    ):
        text = text.replace(before, after)
    config.write_text(text)
    Trainer(load_config(config), tmp / "run", progress=False).run()
    (tmp / "in.xx").write_text("".join(s + "\n" for s, _ in _pairs(360, 1)[300:]))
    return tmp


def _mt(*args: str):
    from typer.testing import CliRunner

    from transformer_mt.cli import app

    return CliRunner().invoke(app, list(args))


def test_the_checkpoint_knows_its_pairs_and_tags(trained):
    from transformer_mt.engines import load_for_inference

    loaded = load_for_inference(trained / "run" / "last.pt")
    assert loaded.pairs == [("xx", "yy"), ("xx", "zz")]
    assert loaded.lang_tags == {"yy": "<2yy>", "zz": "<2zz>"}
    assert loaded.source_prefix("zz") == [loaded.src_tok.piece_id("<2zz>")]


def test_translate_needs_a_target_it_knows_and_routes_by_tag(trained):
    ckpt, src = str(trained / "run" / "last.pt"), str(trained / "in.xx")
    missing = _mt("translate", "-c", ckpt, "-i", src, "--beam", "1")
    assert missing.exit_code == 1
    assert "the model translates into yy, zz: choose one with --target-lang" in missing.output
    unknown = _mt("translate", "-c", ckpt, "-i", src, "--target-lang", "qq")
    assert unknown.exit_code == 1 and "--target-lang qq: the model translates into yy, zz" in (
        unknown.output
    )
    for lang in ("yy", "zz"):
        result = _mt("translate", "-c", ckpt, "-i", src, "--beam", "1", "--target-lang", lang)
        assert result.exit_code == 0, result.output
        assert len(result.stdout.splitlines()) == 60 and "<2" not in result.stdout
    # The tag routes: each target language's references are likelier under their own tag.
    held_out = _pairs(360, 1)[300:]
    for lang, refs in (("yy", held_out), ("zz", _shifted(held_out))):
        ref = trained / f"ref.{lang}"
        ref.write_text("".join(t + "\n" for _, t in refs))
        totals = {}
        for tag in ("yy", "zz"):
            scored = _mt(
                "score", "-c", ckpt, "--src", src, "--trg", str(ref), "--json", "--target-lang", tag
            )
            assert scored.exit_code == 0, scored.output
            totals[tag] = sum(json.loads(x)["logprob"] for x in scored.stdout.splitlines())
        other = "zz" if lang == "yy" else "yy"
        assert totals[lang] > totals[other], f"{lang} references score best under <2{lang}>"


def test_the_export_translates_each_target_like_the_torch_model(trained):
    pytest.importorskip("ctranslate2")
    ckpt, src = str(trained / "run" / "last.pt"), str(trained / "in.xx")
    exported = _mt("export", "-c", ckpt, "-o", str(trained / "ct2"))
    assert exported.exit_code == 0, exported.output
    for lang in ("yy", "zz"):
        ours = _mt("translate", "-c", ckpt, "-i", src, "--beam", "1", "--target-lang", lang)
        theirs = _mt(
            "translate",
            "--engine",
            "ct2",
            "-c",
            str(trained / "ct2"),
            "-i",
            src,
            "--beam",
            "1",
            "--target-lang",
            lang,
        )
        assert theirs.exit_code == 0, theirs.output
        a, b = ours.stdout.splitlines(), theirs.stdout.splitlines()
        assert sum(x == y for x, y in zip(a, b, strict=True)) >= 0.99 * len(a)
    missing = _mt("translate", "--engine", "ct2", "-c", str(trained / "ct2"), "-i", src)
    assert missing.exit_code == 1 and "choose one with --target-lang" in missing.output


def test_plot_draws_each_pair_beside_the_mean(trained):
    import matplotlib

    from transformer_mt.training.plot import plot_metrics

    with matplotlib.rc_context({"svg.fonttype": "none"}):  # legend labels as <text>
        svg = plot_metrics([trained / "run"], trained / "m.svg").read_text()
    for label in ("run mean", "run xx-yy", "run xx-zz"):
        assert label in svg, f"the legend names {label!r}"


def test_the_server_routes_libretranslate_targets_under_32_mixed_requests(trained):
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from test_serve import running

    from transformer_mt.engines.torch_engine import TorchEngine
    from transformer_mt.serve.app import Limits, create_app
    from transformer_mt.serve.batcher import BatchSettings

    ckpt, src = trained / "run" / "last.pt", trained / "in.xx"
    lines = src.read_text().splitlines()[:16]
    expected = {}
    for lang in ("yy", "zz"):
        result = _mt("translate", "-c", str(ckpt), "-i", str(src), "--target-lang", lang)
        assert result.exit_code == 0, result.output
        expected[lang] = dict(
            zip(src.read_text().splitlines(), result.stdout.splitlines(), strict=True)
        )
    assert any(expected["yy"][x] != expected["zz"][x] for x in lines), "the targets differ"
    app = create_app(TorchEngine(ckpt), Limits(), BatchSettings(window_s=0.05, max_wait_s=1.0))
    with running(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        langs = {x["code"]: x["targets"] for x in client.get("/languages").json()}
        assert langs == {"xx": ["yy", "zz"], "yy": [], "zz": []}
        model = client.get("/v1/model").json()
        assert model["pairs"] == [["xx", "yy"], ["xx", "zz"]]
        assert model["lang_tags"] == {"yy": "<2yy>", "zz": "<2zz>"}
        asks = [(line, ("yy", "zz")[i % 2]) for i, line in enumerate(lines * 2)]

        def ask(item: tuple[str, str]) -> str:
            line, target = item
            body = {"q": line, "source": "xx", "target": target}
            reply = client.post("/translate", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["translatedText"]

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(ask, asks))
        for (line, target), answer in zip(asks, answers, strict=True):
            assert answer == expected[target][line], (target, line)
        wrong = client.post("/translate", json={"q": "a", "source": "xx", "target": "qq"})
        assert wrong.status_code == 400 and wrong.json()["error"] == "qq is not supported"
        assert "xx -> yy, xx -> zz" in wrong.json()["detail"]
        untold = client.post("/v1/translate", json={"text": ["a"]})
        assert untold.status_code == 400 and "choose one with target" in untold.json()["error"]
        told = client.post("/v1/translate", json={"text": [lines[0]], "target": "zz"})
        assert told.json()["translations"][0]["text"] == expected["zz"][lines[0]]


def test_fine_tuning_a_tagged_model_on_one_pair_keeps_the_tag(trained):
    from transformer_mt.engines import load_for_inference

    loaded = load_for_inference(trained / "run" / "last.pt")
    cfg = load_config(
        None,
        [
            "name=ft",
            "data.src_lang=xx",
            "data.trg_lang=zz",
            f"data.train=[{{src: {trained}/zz.src, trg: {trained}/zz.trg}}]",
            f"data.valid={{src: {trained}/vzz.src, trg: {trained}/vzz.trg}}",
            f"data.cache_dir={trained / 'ft-cache'}",
            "tokenizer.vocab_size=200",
        ],
    )
    data = prep.prepare(
        cfg, False, tokenizers=(loaded.src_tok, loaded.trg_tok), tags=loaded.lang_tags
    )
    tag = loaded.src_tok.piece_id("<2zz>")
    assert not isinstance(data.train, MixedCorpus), "one source of weight 1: not mixed"
    assert {int(data.train[i][0][0]) for i in range(len(data.train))} == {tag}
    assert data.valid_sets[0].prefix == (tag,)


@pytest.mark.parametrize("beam", [1, 3])
def test_search_never_emits_a_language_tag_even_where_the_model_prefers_it(trained, beam):
    """A model pushed to write a tag at every step (its output raised by 1e4 there) still
    writes none; with the ban lifted, the same search writes tags (the test could fail)."""
    import torch

    from transformer_mt.config import DecodeConfig
    from transformer_mt.decoding.search import search
    from transformer_mt.engines import load_for_inference

    loaded = load_for_inference(trained / "run" / "last.pt", pack=False)
    model, tok = loaded.model, loaded.src_tok
    tags = sorted(tok.piece_id(t) for t in loaded.lang_tags.values())
    assert list(model.never_emit) == tags
    boost = torch.zeros(tok.vocab_size)
    boost[tags] = 1e4
    model.out.register_forward_hook(lambda _m, _i, out: out + boost)
    lines = [s for s, _ in _pairs(360, 1)[300:310]]
    prefix = loaded.source_prefix("zz")
    src = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor([*prefix, *tok.encode(x), 2]) for x in lines], batch_first=True
    )
    decode = DecodeConfig(beam_size=beam, nbest=1, max_len_a=5, max_len_b=1.0)
    emitted = {t for r in search(model, src, decode) for t in r.tokens}
    assert not emitted & set(tags) and emitted
    model.never_emit = ()
    assert set(tags) & {t for r in search(model, src, decode) for t in r.tokens}


def test_the_export_is_told_to_never_emit_a_tag(trained):
    pytest.importorskip("ctranslate2")
    from transformer_mt.engines.ct2 import load_ct2

    out = trained / "ct2-tags"
    assert _mt("export", "-c", str(trained / "run" / "last.pt"), "-o", str(out)).exit_code == 0
    assert sorted(load_ct2(out).never_emit()) == [["<2yy>"], ["<2zz>"]]


def test_attention_says_how_many_source_pieces_the_tag_takes(trained):
    """Markup placement and alignments leave the tag's column out: the engine says where the
    text starts (the tag's piece count), rather than anything guessing it from spelling."""
    from transformer_mt.config import DecodeConfig
    from transformer_mt.engines.engine import load_engine

    engine = load_engine("torch", trained / "run" / "last.pt")
    line = _pairs(360, 1)[300][0]
    decode = DecodeConfig(beam_size=1, nbest=1)
    (result,) = engine.translate([line], decode, attention=True, target="zz")
    attn = result.attention
    assert attn.prefix == 1 and attn.source[0] == "<2zz>"
    assert "".join(attn.source[attn.prefix :]).replace("▁", " ").strip().startswith(line.split()[0])


# --- the toy recipe: two targets against one ----------------------------------------------------


def _toy_multi_bleu(tmp: Path, targets: tuple[str, ...]) -> dict[str, float]:
    """configs/toy_multi.yaml trained on the toy pairs of ``targets`` only (its size, steps and
    every other setting kept); each target's validation BLEU at the last step."""
    from transformer_mt.training.trainer import Trainer

    sources = "[" + ", ".join(f"{{corpus: toy, trg_lang: {t}}}" for t in targets) + "]"
    run = tmp / "-".join(targets)
    overrides = [f"data.cache_dir={run}-cache", f"data.train={sources}"]  # a cache each
    cfg = load_config("toy_multi", [*overrides, f"data.valid={sources}"])
    Trainer(cfg, run, progress=False).run()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in lines if "val_bleu" in m][-1]
    assert last["step"] == cfg.train.max_steps
    if len(targets) == 1:
        return {targets[0]: last["val_bleu"]}
    return {t: last[f"val_bleu/src-{t}"] for t in targets}


@pytest.mark.slow
def test_a_two_target_toy_model_is_within_3_bleu_of_each_one_pair_model(tmp_path):
    """One model translating into both toy targets by tag scores, on each target's validation
    set, within 3 BLEU of a model of the same size, steps and settings trained on that target
    alone (three trainings of the toy recipe's size: several minutes on 2 cores)."""
    two = _toy_multi_bleu(tmp_path, ("trg", "trg2"))
    one = {t: _toy_multi_bleu(tmp_path, (t,))[t] for t in ("trg", "trg2")}
    assert min(one.values()) > 90, one  # both targets are learned: the comparison means something
    for target in one:
        assert two[target] >= one[target] - 3.0, (two, one)


def test_the_length_penalty_script_tunes_one_target_as_evaluate_scores_it(trained, capsys):
    import runpy
    import sys

    ckpt, src = str(trained / "run" / "last.pt"), str(trained / "in.xx")
    ref = trained / "tune_ref.zz"
    ref.write_text("".join(t + "\n" for _, t in _shifted(_pairs(360, 1)[300:])))
    script = Path(__file__).resolve().parents[1] / "scripts" / "tune_len_penalty.py"
    argv = [str(script), "-c", ckpt, "--src", src, "--ref", str(ref), "--beam", "2"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [*argv, "--alphas", "1"])
        with pytest.raises(SystemExit, match="choose one with --target-lang"):
            runpy.run_path(str(script), run_name="__main__")
        mp.setattr(sys, "argv", [*argv, "--alphas", "1", "--target-lang", "zz"])
        runpy.run_path(str(script), run_name="__main__")
    row = capsys.readouterr().out.splitlines()[2]
    direct = _mt(
        "evaluate", "-c", ckpt, "--src", src, "--ref", str(ref), "--beam", "2", "--json",
        "--len-penalty", "1", "--target-lang", "zz",
    )  # fmt: skip
    assert direct.exit_code == 0, direct.output
    assert float(row.split("|")[1]) == round(json.loads(direct.stdout)["bleu"], 2)
