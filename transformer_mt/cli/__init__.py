"""The `mt` command line: each command parses options and calls one library function.

The work itself lives in the package's wings. By concern: :mod:`~transformer_mt.cli.common` (the app, one-line errors, logging, shared options),
:mod:`~transformer_mt.cli.train`, :mod:`~transformer_mt.cli.translate`,
:mod:`~transformer_mt.cli.convert` and :mod:`~transformer_mt.cli.serve`.
"""

# The commands register in this order, which `mt --help` lists.
from transformer_mt.cli.common import app, load_config, user_errors  # noqa: I001
from transformer_mt.cli import train, translate, convert, serve

__all__ = ["app", "convert", "load_config", "main", "serve", "train", "translate", "user_errors"]


def main() -> None:
    """The `mt` program."""
    app()
