"""Corpus-level scores through sacrebleu, each with the signature that makes it comparable.

Inputs are detokenized text (what a user reads), never subword pieces: sacrebleu applies its own
standard tokenization (13a for BLEU, which is what published scores of European languages use;
``zh``, ``ja-mecab``, ``ko-mecab``, ``char`` or ``intl`` for other scripts, see
:data:`BLEU_TOKENIZERS`).
"""

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER

from transformer_mt.config import BLEU_TOKENIZERS
from transformer_mt.errors import MTError


@dataclass
class Scores:
    bleu: float
    chrf: float
    ter: float
    bleu_signature: str
    chrf_signature: str
    ter_signature: str

    def to_dict(self) -> dict[str, float | str]:
        return {
            "bleu": self.bleu,
            "bleu_signature": self.bleu_signature,
            "chrf": self.chrf,
            "chrf_signature": self.chrf_signature,
            "ter": self.ter,
            "ter_signature": self.ter_signature,
        }

    def format(self) -> str:
        return "\n".join(
            [
                f"BLEU = {self.bleu:.2f}  ({self.bleu_signature})",
                f"chrF = {self.chrf:.2f}  ({self.chrf_signature})",
                f"TER  = {self.ter:.2f}  ({self.ter_signature})",
            ]
        )


def corpus_bleu(hyps: list[str], refs: list[str], tokenize: str = "13a") -> float:
    """sacrebleu BLEU (cased, ``tokenize``) of one reference set; validation during training."""
    return bleu_metric(tokenize).corpus_score(hyps, [refs]).score


def bleu_signature(tokenize: str = "13a", nrefs: int = 1) -> str:
    """The signature of :func:`corpus_bleu`'s scores."""
    bleu = bleu_metric(tokenize)
    bleu.corpus_score(["a"], [["a"]] * nrefs)  # the signature names the reference count once scored
    return str(bleu.get_signature())


def bleu_metric(tokenize: str = "13a") -> BLEU:
    """sacrebleu's BLEU with ``tokenize``; an MTError for a tokenizer it lacks or cannot load."""
    if tokenize not in BLEU_TOKENIZERS:
        raise MTError(f"--tokenize {tokenize!r}: expected one of {', '.join(BLEU_TOKENIZERS)}")
    try:
        return BLEU(tokenize=tokenize)
    except RuntimeError as err:  # ja-mecab / ko-mecab without their packages
        raise MTError(f"--tokenize {tokenize}: {' '.join(str(err).split())}") from None


def score_all(hyps: list[str], refs: list[list[str]], tokenize: str = "13a") -> Scores:
    """BLEU, chrF and TER of ``hyps`` against one or more reference sets.

    BLEU (with sacrebleu's ``tokenize``), chrF and TER of ``hyps`` against one or more
    reference sets (each a list of lines)."""
    if not hyps:
        raise MTError("no lines to score")  # sacrebleu fails on empty input
    bleu, chrf, ter = bleu_metric(tokenize), CHRF(), TER()
    b = bleu.corpus_score(hyps, refs)
    c = chrf.corpus_score(hyps, refs)
    t = ter.corpus_score(hyps, refs)
    return Scores(
        bleu=b.score,
        chrf=c.score,
        ter=t.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        ter_signature=str(ter.get_signature()),
    )


def check_same_length(
    hyps: list[str], hyp_name: str, refs: list[list[str]], ref_names: list[str]
) -> None:
    """Check that hypotheses and references have the same number of lines.

    Raise naming both files and their line counts when a reference does not match, or
    when there is nothing to score."""
    for ref, name in zip(refs, ref_names, strict=True):
        if len(ref) != len(hyps):
            raise MTError(
                f"line counts differ: {hyp_name} has {len(hyps)} lines, {name} has {len(ref)}; "
                "each hypothesis needs one reference line"
            )
    if not hyps:
        raise MTError(f"{hyp_name} and {', '.join(ref_names)} are empty: nothing to score")
