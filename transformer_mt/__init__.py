"""transformer-mt: an end-to-end machine translation toolkit around the Transformer."""

__version__ = "0.1.0"
