"""Write docs/CONFIG.md, the reference of every config key, from config/schema.py's declarations.

Each key's section, name, type, default, allowed values and help come from its ``setting(...)``
declaration (the same one that validation, the command-line options and `mt config` read), so
the reference cannot drift from the code; tests/test_config_doc.py fails when the file is not
what this script writes:

    python scripts/config_doc.py            # rewrite docs/CONFIG.md
    python scripts/config_doc.py --check    # exit 1 if docs/CONFIG.md is out of date
"""

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

from transformer_mt.config import (
    Config,
    Setting,
    SourceConfig,
    allowed_values,
    settings_of,
)
from transformer_mt.fileio import write_text_atomic
from transformer_mt.serve.settings import Limits

DOC = Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md"

INTRO = """\
# Configuration reference

Every key a config file (or `--set section.key=value`) can set, generated from the
declarations in `transformer_mt/config/schema.py` by `python scripts/config_doc.py` (a test fails
when this file is out of date). `mt config [NAME_OR_PATH] [--set key=value ...]` prints a resolved config with the
same help as comments; a value outside its allowed range stops `mt train` before any work, with
one line naming the key.
"""

SECTIONS = {
    "data": "Corpus and preparation: which text a run trains on and how it is cleaned.",
    "data.train[] / valid[] / test[]": (
        "One source of parallel text, an item of `data.train`, `data.valid` or `data.test`: "
        "exactly one of `src` (with `trg`), `tsv`, `jsonl`, `parquet`, `tmx`, `corpus`, "
        "`mtdata`, `hf`, `sacrebleu`; the other keys refine it."
    ),
    "tokenizer": "The sentencepiece model(s).",
    "model": "The Transformer's shape and what an imported model computes differently.",
    "train": "Optimization, validation, checkpoints and the machine.",
    "decode": (
        "How a trained model translates (stored in its checkpoints); `mt translate` / "
        "`evaluate` / `score` options and the server's requests override some of them, "
        "checked against the same ranges."
    ),
}


def render() -> str:
    """The whole of docs/CONFIG.md."""
    parts = [
        INTRO,
        "## Top level\n",
        _table("", [s for s in settings_of(Config) if s.name == "name"]),
    ]
    sections = {s.name: s.type for s in settings_of(Config) if dataclasses.is_dataclass(s.type)}
    for title, text in SECTIONS.items():
        cls = SourceConfig if title.startswith("data.train") else sections[title]
        prefix = "" if title.startswith("data.train") else title
        parts += [f"## {title}\n", text + "\n", _table(prefix, settings_of(cls))]
    parts += [
        "## Server limits (`mt serve`)\n",
        "Not config keys: the bounds `mt serve` puts on one request (its options set them). "
        "Where a limit is tighter than a config's range (`max_beam`), a request beyond it is "
        "refused with an error naming the limit.\n",
        _table("", settings_of(Limits)),
    ]
    return "\n".join(parts)


def _table(section: str, declared: list[Setting]) -> str:
    rows = ["| key | type | default | allowed | help |", "|---|---|---|---|---|"]
    for s in declared:
        key = f"{section}.{s.name}" if section else s.name
        option = f" (`{s.option}`)" if s.option else ""
        default = f"`{_default(s.default)}`"
        cells = [f"`{key}`{option}", _type(s.type), default, allowed_values(s), s.help]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _type(tp: object) -> str:
    """A type in a user's words: ``int or null``, ``list of sources``."""
    args = typing.get_args(tp)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return f"{_type(inner)} or null"
    if typing.get_origin(tp) is list:
        (item,) = args
        return "list of sources" if item is SourceConfig else f"list of {_type(item)}"
    return getattr(tp, "__name__", str(tp))


def _default(value: object) -> str:
    if dataclasses.is_dataclass(value):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return str(value)
    return repr(value) if isinstance(value, str) and value == "" else str(value)


def _cell(text: str) -> str:
    """Text for one table cell: no pipe or line break, and ``<name>`` shown, not read as HTML."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if text.startswith("`") else text.replace("<", "&lt;").replace(">", "&gt;")


def main() -> int:
    """Write docs/CONFIG.md, or (--check) say whether it is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = DOC.is_file() and DOC.read_text(encoding="utf-8") == text
        if not current:
            print(f"{DOC} is out of date: run python scripts/config_doc.py", file=sys.stderr)
        return 0 if current else 1
    write_text_atomic(DOC, text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
