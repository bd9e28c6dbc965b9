"""Text around translation: what to translate, sentences, languages, glossaries, kept spans.

Torch-free helpers for what a translation service does before and after the model: whether a
line has anything to translate (:mod:`.content`), cut pasted text into sentences and put it back
together byte for byte (:mod:`.split`), tell which of the model's source languages a text is in
(:mod:`.detect`), read a glossary and find its terms in a sentence (:mod:`.glossary`), and keep
URLs, numbers, code and marked spans out of translation (:mod:`.protect`). Nothing here imports
torch or any part of the package but :mod:`transformer_mt.errors`; the sentence splitter and the
language detector are optional libraries (the ``text`` extra), imported on first use.
"""
