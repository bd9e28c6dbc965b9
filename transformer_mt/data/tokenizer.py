"""Subword tokenization with sentencepiece.

Special ids are fixed for every vocabulary the project trains, so a checkpoint never has to guess
them; they are also recorded in the checkpoint.
"""

import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from transformer_mt.errors import MTError

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}


@dataclass(frozen=True)
class TokenizerSettings:
    """What a sentencepiece model is trained with (mirrors ``TokenizerConfig``)."""

    vocab_size: int
    model_type: str = "unigram"  # unigram | bpe | char | word
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled for training; 0 = all


class Tokenizer:
    """A sentencepiece model with the project's fixed special ids.

    ``encode`` returns pieces' ids without BOS/EOS; callers add them where the model needs them.
    """

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        for name, want in SPECIAL_IDS.items():
            got = getattr(self.sp, f"{name}_id")()
            if got != want:
                raise MTError(f"sentencepiece model has {name}_id={got}, expected {want}")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts, out_type=int)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to detokenized text; special ids are dropped."""
        return self.sp.decode([int(i) for i in ids if i > EOS_ID])

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        return cls(Path(path).read_bytes())

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.model_proto)

    @classmethod
    def train(cls, texts: Iterable[str], settings: TokenizerSettings) -> "Tokenizer":
        """Train a sentencepiece model on an iterable of sentences (kept in memory by spm)."""
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=buf,
                vocab_size=settings.vocab_size,
                model_type=settings.model_type,
                character_coverage=settings.character_coverage,
                input_sentence_size=settings.input_sentence_size,
                shuffle_input_sentence=True,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                hard_vocab_limit=False,  # a small corpus may not support the full size
                minloglevel=2,
                num_threads=2,
            )
        except RuntimeError as err:
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
            raise MTError(
                f"sentencepiece training failed: {msg}; check tokenizer.vocab_size and the data"
            ) from err
        return cls(buf.getvalue())
