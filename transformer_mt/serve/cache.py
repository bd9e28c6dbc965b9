"""The server's translation cache: a line translated once is answered from memory after that.

Keyed by everything that decides a line's result: the line, the decode settings, the target
language, whether attention was asked for, and the glossary terms it must hold (one cache per
engine, so per model). Bounded in lines (least recently used out first); a sampling request is
never cached (its draws differ by design). Lives on the event loop: no lock.
"""

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from transformer_mt.config import DecodeConfig
from transformer_mt.engines.results import LineResult


class TranslationCache:
    """At most ``max_lines`` results, the least recently used dropped first; 0 keeps none."""

    def __init__(self, max_lines: int, counted: Callable[[bool], None] | None = None) -> None:
        self.max_lines = max_lines
        self._results: OrderedDict[Hashable, LineResult] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._counted = counted or (lambda hit: None)  # told of each lookup (the metrics)

    def __len__(self) -> int:
        return len(self._results)

    @staticmethod
    def key(
        line: str,
        decode: DecodeConfig,
        target: str | None,
        attention: bool,
        terms: Sequence[str] | None,
    ) -> Hashable:
        """What decides ``line``'s result (see the module's docstring)."""
        return (line, dataclasses.astuple(decode), target, attention, tuple(terms or ()))

    def enabled_for(self, decode: DecodeConfig) -> bool:
        """Whether results decoded with ``decode`` are kept (not sampled ones)."""
        return self.max_lines > 0 and not decode.sampling

    def get(self, key: Hashable) -> LineResult | None:
        """The result kept under ``key``, counted as a hit or a miss."""
        result = self._results.get(key)
        self._counted(result is not None)
        if result is None:
            self.misses += 1
            return None
        self._results.move_to_end(key)
        self.hits += 1
        return result

    def put(self, key: Hashable, result: LineResult) -> None:
        """Keep ``result`` under ``key``, dropping the least recently used beyond the bound."""
        self._results[key] = result
        self._results.move_to_end(key)
        while len(self._results) > self.max_lines:
            self._results.popitem(last=False)
