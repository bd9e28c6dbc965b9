"""Sentence splitters compared on the project's languages: boundaries, whole paragraphs, speed.

    python scripts/compare_splitters.py                     # ../shared/data Multi30k test_2016
    python scripts/compare_splitters.py --data DIR --seed 1 --verbose

Multi30k test_2016 (de, en from DIR/multi30k, fr, cs from DIR/multi30k-fr-cs; the four align
line by line) is cut into paragraphs of 3-6 consecutive sentences (in order; the sizes drawn
with --seed, the same for every language), each paragraph the sentences joined by one space.
For each splitter and language: boundary precision / recall / F1 (a boundary: where a sentence
starts, the first excluded), the share of paragraphs split exactly right, and the time per
sentence. About 2-5 % of the captions end without a full stop, so no splitter can find the
boundary after them: the "ceiling" column is the recall that a perfect splitter of punctuated
text would get. Then hand-written hard cases (abbreviations, ordinals, decimals, ellipses,
quotes, Chinese and Japanese full stops), each right or wrong as a whole.

A splitter without rules for a language runs with its closest language's (pysbd and
sentencesplit have no Czech: they get Slovak's, marked "*"), or is left out ("-": Moses' rules
have no Chinese or Japanese). "generic" is transformer_mt.text.split's rule for languages
sentencex lacks. The libraries are imported when present (pip install pysbd sentencex
sentencesplit sentence-splitter); a missing one is skipped, saying so.
"""

from __future__ import annotations

import argparse
import gzip
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_mt.text.split import generic_pieces, split_text  # noqa: E402

LANGS = ("en", "de", "fr", "cs")
Splitter = Callable[[str], list[str]]  # a paragraph -> its sentences, whitespace stripped

HARD_CASES: list[tuple[str, str, list[str]]] = [
    ("en", "Dr. Smith arrived at 3.5 p.m. yesterday. He was late.",
     ["Dr. Smith arrived at 3.5 p.m. yesterday.", "He was late."]),
    ("en", "The price rose by 3.5 percent. Analysts were surprised.",
     ["The price rose by 3.5 percent.", "Analysts were surprised."]),
    ("en", "Wait... what happened? Nobody knows.", ["Wait... what happened?", "Nobody knows."]),
    ("en", 'He said "Stop!" Then he left.', ['He said "Stop!"', "Then he left."]),
    ("en", "Mr. and Mrs. Jones met Prof. Lee in the U.S. last week. It rained.",
     ["Mr. and Mrs. Jones met Prof. Lee in the U.S. last week.", "It rained."]),
    ("en", "I bought apples, pears, etc. for the party. It was fun.",
     ["I bought apples, pears, etc. for the party.", "It was fun."]),
    ("de", "Das ist z. B. ein Test. Wir sehen uns morgen.",
     ["Das ist z. B. ein Test.", "Wir sehen uns morgen."]),
    ("de", "Er kaufte Äpfel, Birnen usw. und ging nach Hause. Dann schlief er.",
     ["Er kaufte Äpfel, Birnen usw. und ging nach Hause.", "Dann schlief er."]),
    ("de", "Dr. Müller kommt am 3. Oktober. Bitte warten Sie.",
     ["Dr. Müller kommt am 3. Oktober.", "Bitte warten Sie."]),
    ("de", "Sie fragte: „Kommst du?“ Er nickte.", ["Sie fragte: „Kommst du?“", "Er nickte."]),
    ("de", "Der Wert beträgt 3,5 bzw. 4.5 Prozent. Das ist viel.",
     ["Der Wert beträgt 3,5 bzw. 4.5 Prozent.", "Das ist viel."]),
    ("de", "Ich weiß nicht … Vielleicht morgen.", ["Ich weiß nicht …", "Vielleicht morgen."]),
    ("fr", "M. Dupont est arrivé à 15 h. Il était en retard.",
     ["M. Dupont est arrivé à 15 h.", "Il était en retard."]),
    ("fr", "Mme Curie et M. Durand sont là. Ils attendent.",
     ["Mme Curie et M. Durand sont là.", "Ils attendent."]),
    ("fr", "Vraiment ! C'est incroyable. Tu viens ?",
     ["Vraiment !", "C'est incroyable.", "Tu viens ?"]),
    ("fr", "« Tu viens ? » demanda-t-il. Oui.", ["« Tu viens ? » demanda-t-il.", "Oui."]),
    ("fr", "Le prix est de 3,5 euros, p. ex. ici. C'est cher.",
     ["Le prix est de 3,5 euros, p. ex. ici.", "C'est cher."]),
    ("cs", "Např. jablka a hrušky. To je vše.", ["Např. jablka a hrušky.", "To je vše."]),
    ("cs", "Přišel MUDr. Novák. Byl unavený.", ["Přišel MUDr. Novák.", "Byl unavený."]),
    ("cs", "Stalo se to 5. května 2020. Nikdo nevěděl proč.",
     ["Stalo se to 5. května 2020.", "Nikdo nevěděl proč."]),
    ("cs", "Jsou tam psi, kočky apod. a nic jiného. Konec.",
     ["Jsou tam psi, kočky apod. a nic jiného.", "Konec."]),
    ("cs", "Cena je 3.5 Kč, tj. málo. Kupte si to!",
     ["Cena je 3.5 Kč, tj. málo.", "Kupte si to!"]),
    ("en", "The meeting is at 10 a.m. on Monday. Please be on time.",
     ["The meeting is at 10 a.m. on Monday.", "Please be on time."]),
    ("en", "See Fig. 3 for details. It costs $3.50. That's cheap.",
     ["See Fig. 3 for details.", "It costs $3.50.", "That's cheap."]),
    ("en", "She was born on Jan. 5, 1990. She is a doctor.",
     ["She was born on Jan. 5, 1990.", "She is a doctor."]),
    ("en", "Mail john.doe@example.com or see https://example.com/a.html today. It is free.",
     ["Mail john.doe@example.com or see https://example.com/a.html today.", "It is free."]),
    ("en", '"Are you sure?" she asked. "Yes."', ['"Are you sure?" she asked.', '"Yes."']),
    ("en", "(This is in parentheses.) This is not.", ["(This is in parentheses.)", "This is not."]),
    ("de", "Prof. Dr. Schmidt kommt um 9 Uhr. Er hält einen Vortrag.",
     ["Prof. Dr. Schmidt kommt um 9 Uhr.", "Er hält einen Vortrag."]),
    ("de", "Er wurde im 19. Jahrhundert geboren. Seine Eltern waren arm.",
     ["Er wurde im 19. Jahrhundert geboren.", "Seine Eltern waren arm."]),
    ("de", "Das kostet ca. 20 Euro. Das ist günstig.", ["Das kostet ca. 20 Euro.", "Das ist günstig."]),
    ("de", "Die XY GmbH & Co. KG wurde 1990 gegründet. Sie hat 50 Mitarbeiter.",
     ["Die XY GmbH & Co. KG wurde 1990 gegründet.", "Sie hat 50 Mitarbeiter."]),
    ("de", "Am 1.1.2020 begann alles. Niemand wusste, warum. Was? Das glaube ich nicht!",
     ["Am 1.1.2020 begann alles.", "Niemand wusste, warum.", "Was?", "Das glaube ich nicht!"]),
    ("de", "Er sagte: „Ich komme morgen.“ Dann ging er.",
     ["Er sagte: „Ich komme morgen.“", "Dann ging er."]),
    ("fr", "Voir p. 12 pour les détails. Merci.", ["Voir p. 12 pour les détails.", "Merci."]),
    ("fr", "Il est né le 1er janv. 1990 à Paris. Il y vit encore.",
     ["Il est né le 1er janv. 1990 à Paris.", "Il y vit encore."]),
    ("fr", "M. et Mme Dupont sont arrivés. Bienvenue !",
     ["M. et Mme Dupont sont arrivés.", "Bienvenue !"]),
    ("fr", "Le taux est de 3,5 %. C'est stable… Quelle chance !",
     ["Le taux est de 3,5 %.", "C'est stable…", "Quelle chance !"]),
    ("fr", "Il a dit : « Je viens demain. » Puis il est parti.",
     ["Il a dit : « Je viens demain. »", "Puis il est parti."]),
    ("cs", "Ing. Novák přišel v 8 hod. ráno. Byl unavený.",
     ["Ing. Novák přišel v 8 hod. ráno.", "Byl unavený."]),
    ("cs", "Schůzka je v pondělí 3. 5. 2021 v Praze. Přijďte včas.",
     ["Schůzka je v pondělí 3. 5. 2021 v Praze.", "Přijďte včas."]),
    ("cs", "Prof. RNDr. Jan Novák přednášel. Bylo to zajímavé.",
     ["Prof. RNDr. Jan Novák přednášel.", "Bylo to zajímavé."]),
    ("cs", "Žil v 19. století. Byl to malíř. Cože? To nemyslíš vážně!",
     ["Žil v 19. století.", "Byl to malíř.", "Cože?", "To nemyslíš vážně!"]),
    ("cs", "Řekl: „Přijdu zítra.“ Pak odešel.", ["Řekl: „Přijdu zítra.“", "Pak odešel."]),
    ("zh", "第1.5版发布了。大家都很高兴。", ["第1.5版发布了。", "大家都很高兴。"]),
    ("zh", "他说：「我很好。」我不信。", ["他说：「我很好。」", "我不信。"]),
    ("ja", "価格は3.5ドルです。安いですね？", ["価格は3.5ドルです。", "安いですね？"]),
    ("ja", "彼は「はい。」と答えた。それで終わった。", ["彼は「はい。」と答えた。", "それで終わった。"]),
    ("zh", "我今天很忙。你呢？我们明天见！", ["我今天很忙。", "你呢？", "我们明天见！"]),
    ("zh", "他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
    ("zh", "价格是3.5元。太贵了！", ["价格是3.5元。", "太贵了！"]),
    ("ja", "今日は晴れです。明日は雨でしょうか？散歩しましょう！",
     ["今日は晴れです。", "明日は雨でしょうか？", "散歩しましょう！"]),
    ("ja", "「こんにちは。」と彼は言った。", ["「こんにちは。」と彼は言った。"]),
]  # fmt: skip


def _stripped(pieces: list[str]) -> list[str]:
    return [p.strip() for p in pieces if p.strip()]


def make_splitters() -> dict[str, Callable[[str], Splitter | None]]:
    """Each available library as lang -> splitter (None where it cannot split that language)."""
    found: dict[str, Callable[[str], Splitter | None]] = {}
    try:
        import sentencex

        found["sentencex"] = lambda lang: lambda text: _stripped(sentencex.segment(lang, text))
    except ImportError:
        print("sentencex: not installed, skipped")
    try:
        import pysbd

        def pysbd_for(lang: str) -> Splitter:
            seg = pysbd.Segmenter(language=_closest(lang, pysbd.languages.LANGUAGE_CODES))
            return lambda text: _stripped(seg.segment(text))

        found["pysbd"] = pysbd_for
    except ImportError:
        print("pysbd: not installed, skipped")
    try:
        import sentencesplit

        def sentencesplit_for(lang: str) -> Splitter:
            known = set(sentencesplit.list_languages())
            seg = sentencesplit.Segmenter(language=_closest(lang, known), clean=False)
            return lambda text: _stripped([str(s) for s in seg.segment(text)])

        found["sentencesplit"] = sentencesplit_for
    except ImportError:
        print("sentencesplit: not installed, skipped")
    try:
        from sentence_splitter import SentenceSplitter, SentenceSplitterException

        def moses_for(lang: str) -> Splitter | None:
            try:
                return SentenceSplitter(language=lang).split
            except SentenceSplitterException:
                return None

        found["sentence-splitter"] = moses_for
    except ImportError:
        print("sentence-splitter: not installed, skipped")
    found["generic"] = lambda lang: lambda text: _stripped(generic_pieces(text))
    if "sentencex" in found:
        found["split_text"] = lambda lang: lambda text: split_text(text, lang).sentences
    return found


def _closest(lang: str, known: object) -> str:
    """``lang``, or Slovak's rules for Czech where a library has no Czech."""
    return lang if lang in known else {"cs": "sk"}.get(lang, lang)  # type: ignore[operator]


def paragraphs(data: Path, seed: int) -> dict[str, list[list[str]]]:
    """Per language, test_2016's sentences in paragraphs of 3-6 (the same cuts for every one)."""
    lines = {}
    for lang in LANGS:
        folder = data / ("multi30k" if lang in ("de", "en") else "multi30k-fr-cs")
        with gzip.open(folder / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = [line.strip() for line in f]
    rng, total = random.Random(seed), len(lines["en"])
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(rng.randint(3, 6))
    cuts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return {
        lang: [s[a:b] for a, b in pairwise(cuts) if len(s[a:b]) >= 3] for lang, s in lines.items()
    }


@dataclass
class Score:
    """Boundary counts, exact paragraphs and time of one splitter on one language."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    exact: int = 0
    paragraphs: int = 0
    sentences: int = 0
    reachable: int = 0
    gold_boundaries: int = 0
    seconds: float = 0.0

    def row(self) -> str:
        p = self.tp / max(1, self.tp + self.fp)
        r = self.tp / max(1, self.tp + self.fn)
        f1 = 2 * p * r / max(1e-9, p + r)
        ceiling = self.reachable / max(1, self.gold_boundaries)
        us = 1e6 * self.seconds / max(1, self.sentences)
        exact = self.exact / max(1, self.paragraphs)
        return (
            f"{100 * p:6.2f} {100 * r:6.2f} {100 * f1:6.2f} {100 * ceiling:6.1f} "
            f"{100 * exact:6.1f} {us:8.1f}"
        )


def starts(sentences: list[str]) -> set[int]:
    """Where each sentence but the first starts, counted in non-space characters.

    (Moses' rules squeeze runs of spaces: positions in the text without whitespace compare
    every splitter alike.)
    """
    found, at = set(), 0
    for sentence in sentences[:-1]:
        at += len("".join(sentence.split()))
        found.add(at)
    return found


def score(split: Splitter, paras: list[list[str]]) -> Score:
    """Boundary precision/recall, exact paragraphs and time of ``split`` on the paragraphs."""
    result = Score()
    for sentences in paras:
        text = " ".join(sentences)
        gold = starts(sentences)
        t0 = time.perf_counter()
        pieces = split(text)
        result.seconds += time.perf_counter() - t0
        found = starts(pieces)
        result.tp += len(gold & found)
        result.fp += len(found - gold)
        result.fn += len(gold - found)
        result.exact += gold == found
        result.paragraphs += 1
        result.sentences += len(sentences)
        result.gold_boundaries += len(gold)
        result.reachable += sum(s.rstrip("\"'”»)")[-1:] in ".!?" for s in sentences[:-1])
    return result


def hard_cases(splitters: dict[str, Callable[[str], Splitter | None]], verbose: bool) -> None:
    """Print how many hard cases each splitter gets exactly right (and, verbose, the misses)."""
    print("\nhard cases (exact sentence lists):")
    for name, make in splitters.items():
        right, total, misses = 0, 0, []
        for lang, text, expected in HARD_CASES:
            split = make(lang)
            if split is None:
                continue
            total += 1
            got = split(text)
            right += got == expected
            if got != expected:
                misses.append(f"    {lang}: {got}")
        print(f"  {name:18s} {right:2d}/{total}")
        if verbose:
            print("\n".join(misses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print the hard cases missed")
    args = parser.parse_args()
    splitters = make_splitters()
    if (args.data / "multi30k" / "test_2016_flickr.de.gz").is_file():
        paras = paragraphs(args.data, args.seed)
        n = {lang: sum(map(len, p)) for lang, p in paras.items()}
        print(f"Multi30k test_2016: {len(paras['en'])} paragraphs of 3-6 ({n['en']} sentences)")
        print(f"{'splitter':18s} lang  prec.  recall    F1   ceil. exact%  us/sent")
        for name, make in splitters.items():
            for lang in LANGS:
                split = make(lang)
                if split is None:
                    print(f"{name:18s} {lang}    -")
                    continue
                best = min((score(split, paras[lang]) for _ in range(3)), key=lambda s: s.seconds)
                star = "*" if name in ("pysbd", "sentencesplit") and lang == "cs" else " "
                print(f"{name:18s} {lang}{star}  {best.row()}")
    else:
        print(f"no Multi30k under {args.data}: hard cases only")
    hard_cases(splitters, args.verbose)
    print(
        f"\ntimes: best of 3 runs, one thread; CPU: {cpu_name()}; Python {sys.version.split()[0]}"
    )


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
