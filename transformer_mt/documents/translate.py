"""A document through an engine: its segments translated as lines, rendered in its own format.

:func:`translate_file` translates an .html, .docx, .odt, .pptx or .epub file into a file of the same
format (:mod:`transformer_mt.documents.document` reads it). A segment of several sentences (a
paragraph) is cut into them and each is translated alone, as pasted text is (the engine's
``translate`` with ``TranslateExtras(split=True)``, by the rules of the model's source language);
their attention is joined into the segment's, which places its markup. A glossary holds in every
sentence, as in pasted text.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_mt.documents.document import SUFFIXES, Document
from transformer_mt.engines.options import TranslateExtras
from transformer_mt.errors import MTError
from transformer_mt.fileio import write_output

if TYPE_CHECKING:  # the engine and its settings need torch; documents are read without it
    from transformer_mt.config import DecodeConfig
    from transformer_mt.engines.engine import Engine
    from transformer_mt.text.glossary import Glossary


def is_document(path: Path) -> bool:
    """Whether ``path`` names a document that :func:`translate_file` keeps the format of.

    An HTML page or an office file, by its suffix; a .txt file is lines, as any other."""
    suffix = SUFFIXES.get(path.suffix.lower(), path.suffix.lower())
    return suffix in (".html", ".docx", ".odt", ".pptx", ".epub")


def translate_document(
    engine: "Engine",
    document: Document,
    decode: "DecodeConfig",
    target: str | None = None,
    glossary: "Glossary | None" = None,
) -> bytes:
    """Translate ``document`` with ``engine``, in its own format.

    ``document`` translated by ``engine``: its segments as lines, each cut into sentences and
    joined back (see the module's docstring), with their cross-attention (which places the
    markup inside a segment), rendered in the document's format. ``target``: the language a
    multilingual model translates into. ``glossary``: the terms each sentence's translation
    must hold (a constrained search: the torch engine's)."""
    extras = TranslateExtras(split=True, source_lang=engine.src_lang, glossary=glossary)
    results = engine.translate(document.segments, decode, True, target=target, extras=extras)
    return document.render(results)


def check_document_output(document: Document, output: Path) -> None:
    """An MTError unless ``output`` names a file of ``document``'s format."""
    wanted = SUFFIXES.get(Path(output).suffix.lower(), Path(output).suffix.lower())
    if wanted != document.suffix:
        raise MTError(
            f"--output {output}: a {document.suffix} document translates into a "
            f"{document.suffix} file; give --output the suffix {document.suffix}"
        )


def translate_file(
    engine: "Engine",
    document: Document,
    output: Path,
    decode: "DecodeConfig",
    target: str | None = None,
    inputs: Sequence[Path] = (),
    glossary: "Glossary | None" = None,
) -> None:
    """Translate ``document`` into the file ``output`` of its format.

    Translate ``document`` (:func:`~transformer_mt.documents.document.read_document_file`)
    into the file ``output`` of its format (:func:`check_document_output`), written whole
    (:func:`~transformer_mt.fileio.write_output`: never over one of ``inputs``)."""
    check_document_output(document, output)
    data = translate_document(engine, document, decode, target, glossary)
    write_output(output, data, inputs=inputs)
