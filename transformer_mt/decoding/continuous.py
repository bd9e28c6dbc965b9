"""Continuous batching: a beam search that sentences join and leave between steps.

:func:`~transformer_mt.decoding.search.beam_search` decodes a fixed batch until its last
sentence is done; while the long sentences finish, the batch holds fewer and fewer rows and each
step costs nearly as much as a full one. A server whose requests arrive one at a time would then
wait for the whole batch before it starts the next. :class:`ContinuousSearch` instead admits new
sentences at any step: they take their first step together (one row per sentence, as in
``beam_search``), then join the running rows, each sentence at its own position (the decoder
cache pads and masks the shorter histories, :meth:`~transformer_mt.model.DecoderCache.merge`).
A sentence leaves as soon as it is done and its result goes back at once.

A sentence gets the hypotheses ``beam_search`` gives it alone, up to floating-point rounding
(its rows attend to padded, masked positions that other sentences brought), with the same
stopping rule, length budget and length penalty. One search runs one beam size (its rows are K
per sentence); n-best, length penalty and length budget may differ per sentence. Forced prefixes
and ensembles are not supported here.
"""

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.batching import pad_batch
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.decoding.search import (
    DecodeResult,
    Hypothesis,
    _best,
    _hypothesis,
    _top_candidates,
    max_target_lengths,
)
from transformer_mt.decoding.state import ModelState
from transformer_mt.model import Transformer


@dataclass
class _Sentence:
    """What the search keeps of one sentence besides its rows."""

    tag: Hashable  # the caller's name for it
    decode: DecodeConfig  # its n-best, length penalty and budget
    ended: list[Hypothesis]


class _Rows:
    """The running sentences: sentence i (of n) owns rows i*K .. i*K + K-1 of the decoder state.

    ``tokens`` (n*K, t) holds each row's generated ids at its right end (sentence i's last
    ``steps[i]`` columns), left-padded where sentences joined later."""

    def __init__(self, model: Transformer, k: int, sentences: list[_Sentence], src: torch.Tensor):
        n, dev = len(sentences), src.device
        self.k = k
        self.sentences = sentences
        self.state = ModelState.start(model, src, use_cache=True)
        budgets = [
            max_target_lengths(model, src[i : i + 1], s.decode.max_len_a, s.decode.max_len_b)
            for i, s in enumerate(sentences)
        ]
        self.max_lens = torch.cat(budgets).to(dev)  # (n,)
        self.steps = torch.zeros(n, dtype=torch.long, device=dev)  # (n,) ids generated so far
        self.scores = torch.zeros((n, 1), device=dev)  # (n, B): B = 1 before the first step
        self.tokens = torch.full((n, 1), model.trg_sos_idx, dtype=torch.long, device=dev)
        self.started = False  # the first step done: K rows per sentence

    def merge(self, other: "_Rows") -> None:
        """Append ``other``'s sentences (each after its first step) after these."""
        width = max(self.tokens.size(1), other.tokens.size(1))
        self.tokens = torch.cat([_pad_left(self.tokens, width), _pad_left(other.tokens, width)])
        self.state.merge(other.state)
        self.sentences += other.sentences
        self.max_lens = torch.cat([self.max_lens, other.max_lens])
        self.steps = torch.cat([self.steps, other.steps])
        self.scores = torch.cat([self.scores, other.scores])

    def step(self, eos_idx: int) -> list[tuple[Hashable, DecodeResult]]:
        """Advance every sentence by one step of beam search.

        One step of beam search for every sentence (the first expands one row each); returns
        the sentences that are done, which leave."""
        k = self.k
        log_probs = self.state.log_probs(self.tokens)  # (n*B, V)
        if not self.started:  # all K beams are the same BOS: the first row alone expanded
            self.state.repeat_beams(k)
            self.tokens = self.tokens.repeat_interleave(k, dim=0)
            self.started = True
        top_scores, top_beam, top_tok = _top_candidates(self.scores, log_probs, k)  # (n, 2K)
        is_eos = top_tok == eos_idx

        end_mask = is_eos[:, :k] & top_scores[:, :k].isfinite()  # (n, K)
        if bool(end_mask.any()):
            i_idx, j_idx = end_mask.nonzero(as_tuple=True)
            self._end(i_idx, i_idx * k + top_beam[i_idx, j_idx], top_scores[i_idx, j_idx], True)

        live_scores, live_pos = top_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)
        live_beam = top_beam.gather(1, live_pos)  # (n, K)
        sentences = torch.arange(live_beam.size(0), device=live_beam.device)
        reorder = (sentences[:, None] * k + live_beam).view(-1)  # (n*K,)
        tokens = self.tokens.index_select(0, reorder)
        self.tokens = torch.cat([tokens, top_tok.gather(1, live_pos).view(-1, 1)], dim=1)
        self.scores = live_scores
        self.steps += 1

        at_max = self.max_lens <= self.steps  # (n,)
        if bool(at_max.any()):
            i_idx = at_max.nonzero().squeeze(1)
            rows = (i_idx[:, None] * k + torch.arange(k, device=i_idx.device)).view(-1)
            self._end(i_idx.repeat_interleave(k), rows, self.scores[i_idx].view(-1), False)
        n_ended = [len(s.ended) for s in self.sentences]
        done = at_max | (torch.tensor(n_ended, device=at_max.device) >= k)
        return self._leave(done, reorder)

    def _end(
        self, sent: torch.Tensor, rows: torch.Tensor, logp: torch.Tensor, finished: bool
    ) -> None:
        """End one hypothesis per entry.

        Sentence (m,), its row in ``tokens`` (m,), summed
        log-probs (m,); ``finished``: it ended with EOS (not in ``tokens``)."""
        ids = self.tokens.index_select(0, rows).tolist()
        for i, row, lp in zip(sent.tolist(), ids, logp.tolist(), strict=True):
            sentence, steps = self.sentences[i], int(self.steps[i])
            generated = row[len(row) - steps :] if steps else []
            sentence.ended.append(_hypothesis(generated, lp, finished, sentence.decode.len_penalty))

    def _leave(
        self, done: torch.Tensor, reorder: torch.Tensor
    ) -> list[tuple[Hashable, DecodeResult]]:
        """Move the state's rows as this step moved the beams; the ``done`` sentences leave."""
        if not bool(done.any()):
            self.state.reorder_beams(reorder)
            return []
        k = self.k
        results = [
            (s.tag, _best(s.ended, s.decode.nbest))
            for s, d in zip(self.sentences, done.tolist(), strict=True)
            if d
        ]
        keep = (~done).nonzero().squeeze(1)  # (n',)
        self.sentences = [self.sentences[i] for i in keep.tolist()]
        if keep.numel() == 0:
            return results
        rows = (keep[:, None] * k + torch.arange(k, device=keep.device)).view(-1)
        # The columns the oldest sentence left behind go too (as the cache's positions do): the
        # width stays that of the longest running history, not the search's uptime.
        self.tokens = self.tokens.index_select(0, rows)[:, -(int(self.steps[keep].max()) + 1) :]
        self.scores, self.max_lens, self.steps = (
            self.scores[keep],
            self.max_lens[keep],
            self.steps[keep],
        )
        self.state.select(reorder.index_select(0, rows))
        return results


def _pad_left(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Token rows (R, t) left-padded with 0 to (R, width)."""
    return torch.nn.functional.pad(tokens, (width - tokens.size(1), 0))


class ContinuousSearch:
    """Beam search over sentences that come and go.

    :meth:`add` queues a source; each :meth:`step` advances the running ones by one token, admits
    the queued ones when they are many enough or have waited long enough (their first step:
    ``join_share``, ``join_wait``), and returns the sentences that are done, with their caller's
    tags.

    ``model`` must be a :class:`~transformer_mt.model.Transformer` in eval mode; ``beam_size`` is
    the beam of every sentence (greedy at 1: the same choices as ``greedy_search``).
    """

    def __init__(
        self,
        model: Transformer,
        beam_size: int,
        *,
        eos_idx: int = EOS_ID,
        join_share: float = 0.25,
        join_wait: int = 4,
    ) -> None:
        if model.training:
            raise ValueError("decoding needs model.eval(): dropout would make the search random")
        self.model, self.k, self.eos_idx = model, beam_size, eos_idx
        # Joining has a cost of its own (an encoder pass, a first step for the newcomers, a copy
        # of the merged caches), so queued sentences join together: once they are join_share of
        # the running ones, or after join_wait steps, or at once when nothing runs.
        self.join_share, self.join_wait = join_share, join_wait
        self._waited = 0  # steps the queued sentences have waited
        self._queued: list[tuple[_Sentence, list[int]]] = []
        self._running: _Rows | None = None

    @property
    def beam_size(self) -> int:
        return self.k

    @property
    def running(self) -> int:
        """Sentences in the search (after their first step)."""
        return 0 if self._running is None else len(self._running.sentences)

    @property
    def history(self) -> int:
        """Target positions the decoder cache holds per row: the oldest running sentence's."""
        cache = None if self._running is None else self._running.state.cache
        return 0 if cache is None else cache.length

    @property
    def queued(self) -> int:
        """Sentences waiting for the next step."""
        return len(self._queued)

    def add(self, tag: Hashable, src_ids: list[int], decode: DecodeConfig) -> None:
        """Queue one source to join the search at the next step.

        Queue one source (ids ending in EOS) to join at the next step, decoded with
        ``decode``'s n-best, length penalty and length budget (its beam must be this search's)."""
        if decode.beam_size != self.k:
            raise ValueError(f"this search runs beam {self.k}, not {decode.beam_size}")
        if decode.nbest > self.k:
            raise ValueError(f"nbest={decode.nbest} exceeds the beam ({self.k})")
        if not src_ids:
            raise ValueError("an empty source: it needs at least EOS")
        self._queued.append((_Sentence(tag, decode, []), list(src_ids)))

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, DecodeResult]]:
        """Advance every running sentence by one token and let the queued ones join.

        The queued ones join with their first step (see the class docstring). Returns the (tag,
        result) of each sentence that is done, in no particular order."""
        done = self._running.step(self.eos_idx) if self._running is not None else []
        if self._running is not None and not self._running.sentences:
            self._running = None
        if self._queued and not self._joins_now():
            self._waited += 1
        elif self._queued:
            self._waited = 0
            newcomers = self._admit()
            done += newcomers.step(self.eos_idx)
            if newcomers.sentences:
                if self._running is None:
                    self._running = newcomers
                else:
                    self._running.merge(newcomers)
        return done

    def _joins_now(self) -> bool:
        running = self.running
        return (
            running == 0
            or len(self._queued) >= self.join_share * running
            or self._waited >= self.join_wait
        )

    def _admit(self) -> _Rows:
        queued, self._queued = self._queued, []
        device = next(self.model.parameters()).device
        src = pad_batch([ids for _, ids in queued], self.model.src_pad_idx).to(device)  # (n, S)
        return _Rows(self.model, self.k, [s for s, _ in queued], src)
