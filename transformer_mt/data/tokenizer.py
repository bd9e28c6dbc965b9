"""Subword tokenization with sentencepiece.

Special ids are fixed for every vocabulary the project trains, so a checkpoint never has to guess
them; they are also recorded in the checkpoint.

A multilingual model's language tags (``<2en>``, an imported Marian model's ``>>deu<<``) are
pieces of the vocabulary that text is never cut into: source text that happens to hold
``<2de>`` is translated as the text it is, and the tag's id only ever comes from the target
language asked for (:func:`~transformer_mt.data.languages.source_prefix`).
"""

import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from transformer_mt.errors import MTError
from transformer_mt.fileio import write_bytes_atomic

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
# A target-language tag piece: ours (<2en>, data/languages.py) or an imported Marian model's
# (>>deu<<, convert/marian.py).
_TAG_RE = re.compile(r"<2[A-Za-z0-9_-]+>|>>[A-Za-z0-9_-]+<<")
_UNUSED = 5  # sentencepiece's ModelProto.SentencePiece.Type.UNUSED: never cut from text


@dataclass(frozen=True)
class TokenizerSettings:
    """What a sentencepiece model is trained with (mirrors ``TokenizerConfig``)."""

    vocab_size: int
    model_type: str = "unigram"  # unigram | bpe | char | word
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled for training; 0 = all
    user_symbols: tuple[str, ...] = ()  # pieces kept whole, never split: language tags (<2en>)


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
        # A multilingual model's language tags (<2en>: user-defined symbols) are never text of a
        # translation: decode drops them as it drops the special ids.
        pieces = (self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size()))
        self.tag_ids = frozenset(i for i, p in enumerate(pieces) if _TAG_RE.fullmatch(p))
        # sentencepiece cuts a user-defined symbol (how training reserves a tag's piece) out of
        # any text that holds it: text is cut by a copy of the model whose tags are unused
        # pieces instead, with the same ids (`sp` still knows the tags by name).
        cut = [i for i in self.tag_ids if i in self.sp.encode(self.sp.id_to_piece(i))]
        self._text_sp = self.sp
        if cut:
            text_model = _with_unused_pieces(model_proto, frozenset(cut))
            self._text_sp = spm.SentencePieceProcessor(model_proto=text_model)

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ids included (may be below the size asked for)."""
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """One sentence to piece ids, without BOS/EOS."""
        return self._text_sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many sentences at once (sentencepiece encodes them on several threads)."""
        return self._text_sp.encode(texts, out_type=int)

    def sample_batch(self, texts: list[str], alpha: float, nbest: int = -1) -> list[list[int]]:
        """A sampled segmentation of each sentence (subword regularization).

        Unigram models sample
        among the ``nbest`` best (-1 = all) with smoothing ``alpha``; BPE drops merges with
        probability ``alpha``. Not reproducible across processes: callers cache the result."""
        return self._text_sp.encode(
            texts, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest
        )

    def piece_id(self, piece: str) -> int | None:
        """The id of a whole piece (a language tag), or None when the model lacks it."""
        i = self.sp.piece_to_id(piece)
        return None if i == UNK_ID and piece != self.sp.id_to_piece(UNK_ID) else i

    def pieces(self, text: str) -> list[str]:
        """One sentence to its pieces as strings (for display and debugging)."""
        return self._text_sp.encode(text, out_type=str)

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        """The piece string of each id."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to detokenized text; special ids and language tags are dropped."""
        if self.tag_ids:
            return self.sp.decode([int(i) for i in ids if i > EOS_ID and i not in self.tag_ids])
        return self.sp.decode([int(i) for i in ids if i > EOS_ID])

    def decode_pieces(self, pieces: Iterable[str]) -> str:
        """Decode pieces (CTranslate2's output) to text.

        Pieces (CTranslate2's output) to the text :meth:`decode` gives for their ids (an
        unknown piece, like ``<unk>``, is dropped, not written as sentencepiece's " ⁇ ")."""
        return self.decode(self.sp.piece_to_id(list(pieces)))

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        """Read a ``.model`` file written by :meth:`save` (or by sentencepiece itself)."""
        return cls(Path(path).read_bytes())

    def save(self, path: Path) -> None:
        """Write the serialized model atomically: a reader sees the old file or the whole new one."""
        write_bytes_atomic(Path(path), self.model_proto)

    @classmethod
    def train(cls, texts: Iterable[str], settings: TokenizerSettings) -> "Tokenizer":
        """Train a sentencepiece model on an iterable of sentences, streamed.

        sentencepiece reads the iterable to its end but keeps only a uniform sample of
        ``settings.input_sentence_size`` sentences (reservoir sampling), so a generator over a
        corpus larger than RAM is fine. An exception raised by the iterable (e.g. an
        :class:`MTError` naming a bad line) is re-raised as it was: sentencepiece would otherwise
        turn it into a RuntimeError and lose the message.
        """
        failure: list[BaseException] = []
        counted = [0]

        def guarded() -> Iterator[str]:
            try:
                for text in texts:
                    counted[0] += 1
                    yield text
            except BaseException as err:  # also Ctrl-C: it must reach the caller unchanged
                failure.append(err)
                raise

        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=guarded(),
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
                user_defined_symbols=list(settings.user_symbols),
                hard_vocab_limit=False,  # a small corpus may not support the full size
                minloglevel=2,
                num_threads=2,
            )
        except RuntimeError as err:
            if failure:
                raise failure[0] from None
            if counted[0] == 0:
                raise MTError("sentencepiece training got no sentences; check the data") from None
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
            raise MTError(
                f"sentencepiece training failed: {msg}; check tokenizer.vocab_size and the data"
            ) from err
        if failure:  # pragma: no cover - sentencepiece always reports the iterator's error
            raise failure[0]
        return cls(buf.getvalue())


def _with_unused_pieces(model_proto: bytes, ids: frozenset[int]) -> bytes:
    """``model_proto`` with the pieces ``ids`` made unused: text is never cut into them.

    The serialized ModelProto is rewritten as protobuf's wire format has it (field 1: the
    pieces, in id order; a piece's field 3: its type), so that no protobuf package is needed;
    every other byte is kept."""
    out, pos, index = bytearray(), 0, 0
    while pos < len(model_proto):
        start = pos
        key, pos = _varint(model_proto, pos)
        end = _field_end(model_proto, pos, key & 7)
        if key == (1 << 3 | 2):  # a piece
            if index in ids:
                _, body = _varint(model_proto, pos)
                piece = _without_field(model_proto[body:end], 3) + bytes([3 << 3, _UNUSED])
                out += _varint_bytes(key) + _varint_bytes(len(piece)) + piece
            else:
                out += model_proto[start:end]
            index += 1
        else:
            out += model_proto[start:end]
        pos = end
    return bytes(out)


def _without_field(message: bytes, number: int) -> bytes:
    """A serialized message without its fields numbered ``number``."""
    out, pos = bytearray(), 0
    while pos < len(message):
        start = pos
        key, pos = _varint(message, pos)
        pos = _field_end(message, pos, key & 7)
        if key >> 3 != number:
            out += message[start:pos]
    return bytes(out)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos``, and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise MTError("a damaged sentencepiece model (a field runs past its end)")
        byte = data[pos]
        pos, value, shift = pos + 1, value | (byte & 0x7F) << shift, shift + 7
        if byte < 0x80:
            return value, pos


def _varint_bytes(value: int) -> bytes:
    """``value`` as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_end(data: bytes, pos: int, wire_type: int) -> int:
    """Where a field's value that starts at ``pos`` ends."""
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == 2:
        size, pos = _varint(data, pos)
        return pos + size
    if wire_type in (1, 5):
        return pos + (8 if wire_type == 1 else 4)
    raise MTError(f"a damaged sentencepiece model (wire type {wire_type})")
