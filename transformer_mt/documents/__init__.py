"""Documents as segments to translate, and back in their own format.

HTML fragments and files (.txt, .html, .docx, .odt, .pptx, .epub).

``document`` (the interface and the formats by suffix), ``html`` (HTML pages and fragments),
``office`` (.docx/.pptx/.odt through their libraries), ``placement`` (inline markup put back on the
words the cross-attention links it to), ``translate`` (a document through an engine).

Torch-free (reading a .docx imports no torch); never imports :mod:`transformer_mt.serve`.
"""
