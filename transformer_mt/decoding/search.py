"""Search over a trained Transformer: greedy, beam search and sampling. Token ids in, token ids out.

All three take a padded source batch ``src`` (B, S) of ids ending in EOS (padding =
``model.src_pad_idx``) and a :class:`~transformer_mt.config.DecodeConfig` (already validated by
``validate_decode``: n-best within the beam, sampling settings in range), and return one
:class:`DecodeResult` per sentence, in batch order. :func:`search` picks the one the config asks
for. They run under ``torch.inference_mode`` and need the model in eval mode (dropout would
randomize the search), which is the caller's job: ``model.eval()``.

Speed: with ``use_cache=True`` (the default) every step feeds the decoder one new position and
reuses the keys/values of earlier positions (:class:`~transformer_mt.model.DecoderCache`); the
source's cross-attention keys/values are computed once. ``use_cache=False`` re-runs the decoder on
the whole prefix at every step, the slow reference that tests and benchmarks compare against.
Finished sentences leave the active batch (and the cache), so they stop costing compute. They
go a block at a time (:data:`ROW_BLOCK` rows): until then a finished sentence stays as a retired
one, whose rows are computed and ignored (in beam search, its beams scored -inf so that they
never end a hypothesis again). The batch's row counts are then few and mostly multiples of the
block, and oneDNN builds a product kernel for each new shape it sees.

Length: a sentence gets at most n = ``max_len_a + max_len_b * source_length`` decoding steps
(source length counts the source's EOS), capped by the size of the model's position table
(``model.positions.max_len``): a finished hypothesis holds at most n - 1 tokens and its EOS (EOS
counts toward n, as in CTranslate2); a hypothesis cut at n tokens has ``finished=False``.

Scores are sums of token log-probabilities (EOS included) divided by the GNMT length penalty
``((5 + length) / 6) ** alpha`` (Wu et al., 2016), length counting EOS; ``alpha=0`` gives raw sums.

Ensembles: wherever a Transformer goes, an :class:`~transformer_mt.decoding.ensemble.Ensemble`
may go too; its token log-probs are the mean of its models'. Search reaches the model only
through a decoder state (:mod:`~transformer_mt.decoding.state`), so each search exists once.

Target prefixes: ``prefixes`` (one list of target ids per sentence, no BOS/EOS, possibly empty)
forces each output to start with its prefix; search continues from there. A forced token adds
its log-probability to the score like any other, and counts toward the length budget, which is
raised to ``len(prefix) + 1`` where the prefix alone would reach it (within the position table),
so every hypothesis holds the whole prefix. All n-best hypotheses start with it.

Lexical constraints: ``constraints`` (per sentence, a list of target id sequences; see
:mod:`~transformer_mt.decoding.constraints`) make :func:`search` run
:func:`constrained_beam_search`: every finished hypothesis contains each of its sentence's
constraints. It needs beam search (beam >= 2, no sampling) and works with prefixes.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from transformer_mt.config import DecodeConfig
from transformer_mt.data.tokenizer import EOS_ID
from transformer_mt.decoding.constraints import (
    ConstraintRows,
    Constraints,
    ConstraintTable,
    Words,
    allocation_order,
    drop_duplicates,
)
from transformer_mt.decoding.ensemble import Ensemble, SearchModel
from transformer_mt.decoding.prefixes import ForcedPrefixes, Prefixes
from transformer_mt.decoding.state import DecoderState, ModelState
from transformer_mt.errors import MTError


@dataclass(frozen=True)
class Hypothesis:
    """One output sequence."""

    tokens: list[int]  # target ids without BOS and EOS
    score: float  # sum of log-probs / GNMT length penalty
    finished: bool  # True: ended with EOS; False: cut at the maximum length
    # False: lacks one of its sentence's lexical constraints (only ever the one, unfinished
    # result of a sentence none of whose hypotheses met them; see constrained_beam_search)
    constraints_met: bool = True


@dataclass(frozen=True)
class DecodeResult:
    """The output for one source sentence: its hypotheses, best first (distinct token lists)."""

    nbest: list[Hypothesis]

    @property
    def tokens(self) -> list[int]:
        return self.nbest[0].tokens

    @property
    def score(self) -> float:
        return self.nbest[0].score


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``."""
    return ((5.0 + length) / 6.0) ** alpha


def max_target_lengths(
    model: SearchModel,
    src: torch.Tensor,
    max_len_a: float,
    max_len_b: float,
    min_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-sentence token budget of a search.

    Per-sentence token budget ``a + b * source length``, at least ``min_lens`` (B,) if given
    (a forced prefix and one more token), in [1, position table size]; (B,)."""
    src_len = (src != model.src_pad_idx).sum(dim=1).double()  # (B,)
    limit = torch.floor(max_len_a + max_len_b * src_len).long()
    if min_lens is not None:
        limit = torch.maximum(limit, min_lens.to(limit.device))
    # Target positions 0 .. n-1 feed the decoder to produce n tokens: n may reach the table size.
    return limit.clamp(1, model.positions.max_len)


def _check_model(model: SearchModel) -> None:
    if model.training:
        raise ValueError("decoding needs model.eval(): dropout would make the search random")


def _start_state(model: SearchModel, src: torch.Tensor, use_cache: bool) -> DecoderState:
    """The decoder state of a source batch (B, S): one row per sentence."""
    if isinstance(model, Ensemble):
        return model.start(src, use_cache)
    return ModelState.start(model, src, use_cache)


def _forced(
    model: SearchModel, prefixes: Prefixes | None, src: torch.Tensor, eos_idx: int
) -> ForcedPrefixes | None:
    """The checked prefixes of the batch ``src`` (B, S), None when no sentence has one."""
    banned = {model.trg_pad_idx, model.trg_sos_idx, eos_idx}
    return ForcedPrefixes.of(prefixes, src, banned=banned, table=model.positions.max_len)


def _hypothesis(
    ids: list[int], logp: float, eos: bool, alpha: float, met: bool = True
) -> Hypothesis:
    """``ids``: generated ids (no BOS; EOS, if any, already dropped); ``met``: see Hypothesis."""
    return Hypothesis(ids, logp / length_penalty(len(ids) + int(eos), alpha), eos, met)


# Search drops finished sentences from its batch so that its rows (sentences x K beams, or one
# row each) stay a multiple of this, where the beam allows (32 // K sentences at a time; K > 32:
# each at once).
# Each new row count costs oneDNN a product kernel per layer shape on first use. Dropping each
# sentence at once, a fresh process's first pass over test_2016_flickr met 356 shapes and ran
# 0.25-0.53 s slower than its second; with blocks of 32 rows, 206 shapes and 0.11-0.20 s
# (blocks of 16: 261; of 64: 160, no faster). Part of what is left is the first touch of the
# search's memory: with the heap touched beforehand the first pass ran 0.08-0.10 s slower, so
# a kernel costs at most ~0.5 ms (EPYC). A retired sentence costs its rows' compute until its
# block is dropped.
ROW_BLOCK = 32


def _kept_after_drop(closed: torch.Tensor, per_block: int) -> torch.Tensor | None:
    """The sentences (indices into ``closed`` (n,)) that stay once a block can be dropped.

    ``closed`` marks those that need no more steps, at least one live. None while the live
    ones fill as many blocks of ``per_block`` sentences as the batch holds (the finished then
    stay, retired); else the live ones and as many finished ones as fill their last block, in
    batch order."""
    live = (~closed).nonzero().squeeze(1)
    n_kept = -(-live.numel() // per_block) * per_block
    if n_kept >= closed.numel():
        return None
    retired = closed.nonzero().squeeze(1)[: n_kept - live.numel()]
    return torch.cat([live, retired]).sort().values


def _sequential_search(
    model: SearchModel,
    src: torch.Tensor,
    choose: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    decode: DecodeConfig,
    use_cache: bool,
    eos_idx: int,
    prefixes: Prefixes | None,
) -> list[DecodeResult]:
    """Greedy-style search: one hypothesis per sentence, extended by ``choose``.

    One hypothesis per sentence, extended by ``choose(log_probs (R, V), sentence (R,), step)
    -> ids (R,)``, ``sentence`` being each row's index in ``src``."""
    _check_model(model)
    n_sent = src.size(0)
    forced = _forced(model, prefixes, src, eos_idx)
    min_lens = None if forced is None else forced.min_lens()
    max_lens = max_target_lengths(model, src, decode.max_len_a, decode.max_len_b, min_lens)  # (B,)
    max_lens = max_lens.to(src.device)
    state = _start_state(model, src, use_cache)
    sent = torch.arange(n_sent, device=src.device)  # sentence index of each active row
    tokens = torch.full((n_sent, 1), model.trg_sos_idx, dtype=torch.long, device=src.device)
    logp_sum = torch.zeros(n_sent, device=src.device)  # (R,)
    retired = torch.zeros(n_sent, dtype=torch.bool, device=src.device)  # (R,) see ROW_BLOCK
    results: list[DecodeResult | None] = [None] * n_sent

    for step in range(int(max_lens.max())):
        log_probs = state.log_probs(tokens)  # (R, V)
        if forced is not None:
            log_probs = forced.force(log_probs, sent, step)
        nxt = choose(log_probs, sent, step)  # (R,)
        logp_sum += log_probs.gather(1, nxt[:, None]).squeeze(1)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)  # (R, step + 2)
        ended = nxt == eos_idx
        done = (ended | (max_lens <= step + 1)) & ~retired  # newly finished rows
        if not bool(done.any()):
            continue
        done_rows = done.nonzero().squeeze(1)
        for s, eos, lp, toks in zip(
            sent[done_rows].tolist(),
            ended[done_rows].tolist(),
            logp_sum[done_rows].tolist(),
            tokens[done_rows, 1:].tolist(),
            strict=True,
        ):
            results[s] = DecodeResult(
                [_hypothesis(toks[:-1] if eos else toks, lp, eos, decode.len_penalty)]
            )
        closed = retired | done  # (R,) rows that need no more steps
        if bool(closed.all()):
            break
        keep = _kept_after_drop(closed, ROW_BLOCK)
        if keep is None:  # no block to drop: the finished rows retire in place
            retired = closed
            continue
        # Finished rows leave every tensor a block at a time, so later steps compute only what
        # is still open (and a few retired rows).
        tokens, logp_sum, sent, max_lens = tokens[keep], logp_sum[keep], sent[keep], max_lens[keep]
        retired = closed[keep]
        state.select(keep)
    finished = [r for r in results if r is not None]
    assert len(finished) == len(results), "every row ends: EOS or its length limit"
    return finished


@torch.inference_mode()
def greedy_search(
    model: SearchModel,
    src: torch.Tensor,
    decode: DecodeConfig,
    *,
    use_cache: bool = True,
    eos_idx: int = EOS_ID,
    prefixes: Prefixes | None = None,
) -> list[DecodeResult]:
    """Pick the most probable token at each step (after the forced ``prefixes``, if any).

    Uses the length rule and the length penalty of ``decode`` (the penalty only scales the reported
    score); ignores the beam settings."""

    def choose(log_probs: torch.Tensor, sentence: torch.Tensor, step: int) -> torch.Tensor:
        return log_probs.argmax(dim=-1)

    return _sequential_search(model, src, choose, decode, use_cache, eos_idx, prefixes)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Filter logits by top-k and top-p (nucleus).

    Set to -inf every logit (R, V) outside the ``top_k`` best and outside the smallest set whose
    probability reaches ``top_p`` (nucleus). ``top_k=0`` and ``top_p=1`` switch a filter off."""
    if top_k > 0 and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (R, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (R, V)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens before it already hold top_p: the best one always stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


class LineDraws:
    """The random numbers of sampling: one uniform draw in (0, 1] per line and step.

    Each draw is a hash of (seed, the line's key, step), so a line's sample depends on its key and
    the seed only, never on the lines decoded beside it, the batch size or their order (a shared
    generator's draws would go to whichever rows a batch holds).

    The hash is the output function of the splitmix64 generator (a bijection of 64-bit words;
    the generator it finishes passes the BigCrush tests) applied to the seed, then to it combined
    with the key, then with the step; the top 53 bits make the float.
    """

    def __init__(self, seed: int, keys: Sequence[int]) -> None:
        """``keys``: one integer per row of the batch (e.g. its line number in the input)."""
        with np.errstate(over="ignore"):
            self._base = _mix(np.array([int(seed) % 2**64], dtype=np.uint64))
            words = np.array([int(k) % 2**64 for k in keys], dtype=np.uint64)
            self._keys = _mix(self._base ^ words)

    def uniform(self, rows: torch.Tensor, step: int) -> torch.Tensor:
        """Uniform draws in (0, 1] for the batch rows ``rows`` at ``step``.

        (R,) float64 draws in (0, 1] for the batch rows ``rows`` (R,) at ``step``, on the CPU
        (1 only by rounding, which :func:`draw_tokens` takes as the last token of probability)."""
        with np.errstate(over="ignore"):
            step_word = _mix(np.array([step], dtype=np.uint64) + _GOLDEN)
            bits = _mix(self._keys[rows.cpu().numpy()] ^ step_word) >> np.uint64(11)
        return torch.from_numpy((bits.astype(np.float64) + 0.5) * 2.0**-53)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def draw_tokens(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Pick token ids from ``probs`` by inverting each row's cumulative distribution.

    The token ids (R,) that the draws ``uniform`` (R,) in (0, 1] pick from ``probs`` (R, V), by
    inverting each row's cumulative distribution: token i with probability ``probs[i]``, and a
    token of probability 0 never. In float64 (float32 on MPS, which has no float64)."""
    dtype = torch.float32 if probs.device.type == "mps" else torch.float64
    cdf = probs.to(dtype).cumsum(dim=-1)  # (R, V)
    total = cdf[:, -1]
    if not bool((total > 0).all() and total.isfinite().all()):
        raise MTError(
            "sampling met a distribution with no probability (the model's outputs are not "
            "finite, or top-k/top-p/temperature left no token): check the model and those options"
        )
    target = (uniform.to(cdf.device, dtype) * total).unsqueeze(1)  # (R, 1), in (0, total]
    return torch.searchsorted(cdf, target).squeeze(1).clamp_(max=probs.size(-1) - 1)


@torch.inference_mode()
def sample(
    model: SearchModel,
    src: torch.Tensor,
    decode: DecodeConfig,
    *,
    line_keys: Sequence[int] | None = None,
    use_cache: bool = True,
    eos_idx: int = EOS_ID,
    prefixes: Prefixes | None = None,
) -> list[DecodeResult]:
    """Sample each token from the model's (filtered) distribution.

    Draw each token from softmax(logits / temperature), optionally top-k / top-p filtered
    (back-translation), with ``decode.temperature``, ``top_k`` and ``top_p``. The score is the
    model's own log-probability of the draw (temperature 1, unfiltered), divided by the length
    penalty of ``decode`` as every search's score is (``len_penalty`` 0: the plain sum). The
    draws are :class:`LineDraws` of ``decode.sample_seed`` and ``line_keys`` (one per row of
    ``src``; None: the row indices), so a row's sample depends on its key, not on its batch.
    Forced ``prefixes`` draw nothing: their tokens are the only ones with probability."""
    temperature, top_k, top_p = decode.temperature, decode.top_k, decode.top_p
    keys = range(src.size(0)) if line_keys is None else line_keys
    if len(keys) != src.size(0):
        raise ValueError(f"{len(keys)} line keys for {src.size(0)} sources: one each")
    draws = LineDraws(decode.sample_seed, keys)

    def choose(log_probs: torch.Tensor, sentence: torch.Tensor, step: int) -> torch.Tensor:
        probs = filter_logits(log_probs / temperature, top_k, top_p).softmax(dim=-1)  # (R, V)
        return draw_tokens(probs, draws.uniform(sentence, step))

    return _sequential_search(model, src, choose, decode, use_cache, eos_idx, prefixes)


@dataclass
class _Beams:
    """The sentences beam search still works on. Sentence i (of n) owns rows i*K .. i*K + K-1.

    A retired sentence is finished but still in the batch (see :data:`ROW_BLOCK`): its scores are
    -inf, so its beams never end a hypothesis or reach a live one's candidates."""

    k: int  # beam size K
    sent: torch.Tensor  # (n,) original index of each active sentence
    max_lens: torch.Tensor  # (n,) token budget of each
    scores: torch.Tensor  # (n, K) summed log-probs of each beam
    tokens: torch.Tensor  # (n*K, t) BOS and the generated ids of each beam
    state: DecoderState  # the model(s)' memory and caches, n*K rows
    forced: ForcedPrefixes | None  # target prefixes, by original sentence index
    retired: torch.Tensor  # (n,) bool: finished, kept until its block of rows is dropped
    terms: ConstraintRows | None = None  # constrained search: each row's constraint state

    @classmethod
    def start(
        cls,
        model: SearchModel,
        src: torch.Tensor,
        decode: DecodeConfig,
        use_cache: bool,
        forced: ForcedPrefixes | None,
        extra_len: torch.Tensor | None = None,
    ) -> "_Beams":
        """Beams of BOS for the sentences of ``src``.

        ``extra_len`` (B,): tokens that each budget must fit beyond its forced prefix (if any)
        and one more token (a constrained search's constraint tokens)."""
        k, n, dev = decode.beam_size, src.size(0), src.device
        min_lens = None if forced is None else forced.min_lens()
        if extra_len is not None:
            min_lens = extra_len + (1 if min_lens is None else min_lens)
        max_lens = max_target_lengths(model, src, decode.max_len_a, decode.max_len_b, min_lens)
        state = _start_state(model, src, use_cache)  # n rows; K per sentence after step 0
        tokens = torch.full((n * k, 1), model.trg_sos_idx, dtype=torch.long, device=dev)
        # All K beams start as the same BOS: step 0 expands beam 0 alone (see log_probs), else the
        # beam would fill with copies of one hypothesis.
        scores = torch.zeros((n, k), device=dev)  # (n, K)
        sent = torch.arange(n, device=dev)
        retired = torch.zeros(n, dtype=torch.bool, device=dev)
        return cls(k, sent, max_lens.to(dev), scores, tokens, state, forced, retired)

    def log_probs(self, step: int) -> torch.Tensor:
        """The next-token log-probs of the beams that may expand.

        Next-token log-probs (n*B, V) of the beams that may expand, prefixes forced: all K
        (B = K), except at step 0, where the K beams of a sentence are the same BOS and only the
        first expands (B = 1). The model then runs one row per sentence, and only afterwards does
        the state make room for K beams each."""
        if step == 0:
            log_probs = self.state.log_probs(self.tokens[:: self.k])  # (n, V)
            self.state.repeat_beams(self.k)
        else:
            log_probs = self.state.log_probs(self.tokens)  # (n*K, V)
        if self.forced is None:
            return log_probs
        sentences = self.sent if step == 0 else self.sent.repeat_interleave(self.k)
        return self.forced.force(log_probs, sentences, step)

    def rows(self, sentences: torch.Tensor) -> torch.Tensor:
        """The rows (m*K,) of the beams of active sentences (m,)."""
        beam_offsets = torch.arange(self.k, device=sentences.device)
        return (sentences[:, None] * self.k + beam_offsets).view(-1)  # (m*K,)

    def advance(
        self,
        top_scores: torch.Tensor,
        top_beam: torch.Tensor,
        top_tok: torch.Tensor,
        is_eos: torch.Tensor,
    ) -> torch.Tensor:
        """Extend the beams with the K best non-EOS of this step's 2K candidates (n, 2K).

        At most K of the 2K are EOS, so there are always K. Returns the row each new row
        continues."""
        live_scores, live_pos = top_scores.masked_fill(is_eos, float("-inf")).topk(self.k, dim=1)
        live_beam = top_beam.gather(1, live_pos)  # (n, K)
        live_tok = top_tok.gather(1, live_pos)  # (n, K)
        sentences = torch.arange(live_beam.size(0), device=live_beam.device)  # (n,)
        reorder = (sentences[:, None] * self.k + live_beam).view(-1)  # (n*K,)
        tokens = self.tokens.index_select(0, reorder)
        self.tokens = torch.cat([tokens, live_tok.view(-1, 1)], dim=1)  # (n*K, t + 1)
        self.scores = live_scores
        return reorder

    def follow(self, reorder: torch.Tensor, finished: torch.Tensor) -> bool:
        """Move the decoder state's rows as the beams moved; retire or drop finished sentences.

        Move the decoder state's rows as :meth:`advance` moved the beams (``reorder`` (n*K,)).
        ``finished`` (n,): the sentences that need no more steps, retired ones included. Those
        newly finished are retired, or, where the live ones fit in fewer blocks of
        :data:`ROW_BLOCK` rows than the batch, finished ones are dropped everywhere (down to
        whole blocks). False when no live sentence is left."""
        if not bool((finished & ~self.retired).any()):
            # Beams move only within their sentence: memory and cross-attention stay as they are.
            self.state.reorder_beams(reorder)
            return True
        if bool(finished.all()):
            return False
        keep = _kept_after_drop(finished, max(1, ROW_BLOCK // self.k))  # (n',)
        if keep is None:  # no block to drop: the newly finished retire in place
            self.retired = finished
            self.scores = self.scores.masked_fill(finished[:, None], float("-inf"))
            self.state.reorder_beams(reorder)
            return True
        rows = self.rows(keep)  # (n'*K,)
        self.tokens = self.tokens.index_select(0, rows)
        if self.terms is not None:
            self.terms = self.terms.select(rows)
        self.retired = finished[keep]
        self.scores = self.scores[keep].masked_fill(self.retired[:, None], float("-inf"))
        self.sent, self.max_lens = self.sent[keep], self.max_lens[keep]
        # One gather both reorders the beams and drops the done sentences.
        self.state.select(reorder.index_select(0, rows))
        return True


@torch.inference_mode()
def beam_search(
    model: SearchModel,
    src: torch.Tensor,
    decode: DecodeConfig,
    *,
    use_cache: bool = True,
    eos_idx: int = EOS_ID,
    prefixes: Prefixes | None = None,
) -> list[DecodeResult]:
    """Beam search over all sentences at once: rows are (sentence, beam) pairs, (B*K, t).

    Each step ranks the 2K best extensions per sentence. An EOS among the K best ends a hypothesis;
    the K best non-EOS extensions stay on the beam (so beam 1 picks exactly what greedy picks). A
    sentence is done when it holds K (``decode.beam_size``) ended hypotheses or reaches its maximum
    length (then its live beams end unfinished); done sentences leave the batch. Returns the
    ``decode.nbest`` best of each sentence by length-penalized score, best first; they are distinct
    token sequences because every beam is a distinct path. While a sentence's forced prefix lasts,
    its prefix token is the only candidate of every beam.
    """
    _check_model(model)
    k, len_penalty = decode.beam_size, decode.len_penalty
    beams = _Beams.start(model, src, decode, use_cache, _forced(model, prefixes, src, eos_idx))
    ended: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]

    for step in range(int(beams.max_lens.max())):
        log_probs = beams.log_probs(step)  # (n*B, V): B = 1 at step 0, else K
        expanding = beams.scores[:, : log_probs.size(0) // beams.scores.size(0)]  # (n, B)
        top_scores, top_beam, top_tok = _top_candidates(expanding, log_probs, k)  # (n, 2K)
        is_eos = top_tok == eos_idx

        # EOS among the K best candidates ends a hypothesis (not a -inf one: a forced prefix
        # leaves each beam one finite candidate).
        end_mask = is_eos[:, :k] & top_scores[:, :k].isfinite()  # (n, K)
        if bool(end_mask.any()):
            i_idx, j_idx = end_mask.nonzero(as_tuple=True)
            rows = i_idx * k + top_beam[i_idx, j_idx]
            ids, logp = beams.tokens[rows, 1:], top_scores[i_idx, j_idx]
            _end_hypotheses(ended, beams.sent[i_idx], logp, ids, True, len_penalty)

        reorder = beams.advance(top_scores, top_beam, top_tok, is_eos)  # (n*K,)

        at_max = (beams.max_lens <= step + 1) & ~beams.retired  # (n,)
        if bool(at_max.any()):
            i_idx = at_max.nonzero().squeeze(1)
            rows = beams.rows(i_idx)  # (m*K,)
            ids, logp = beams.tokens[rows, 1:], beams.scores[i_idx].view(-1)
            sentences = beams.sent[i_idx].repeat_interleave(k)
            _end_hypotheses(ended, sentences, logp, ids, False, len_penalty)
        n_ended = torch.tensor([len(ended[s]) for s in beams.sent.tolist()], device=src.device)
        if not beams.follow(reorder, beams.retired | at_max | (n_ended >= k)):
            break

    return [_best(hyps, decode.nbest) for hyps in ended]


def _top_candidates(
    scores: torch.Tensor, log_probs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 2K best one-token extensions per sentence, best first.

    From the summed scores (n, B)
    of the B beams that expand (K, or 1 at step 0) and their next-token log-probs (n*B, V):
    summed scores, beam index in 0..B-1 and token, each (n, 2K)."""
    (n_act, beams), vocab = scores.shape, log_probs.size(-1)
    if 2 * k + 2 > vocab:  # 2K finite candidates per sentence; PAD and BOS are never emitted
        raise ValueError(f"beam_size={k} needs a vocabulary of at least {2 * k + 2}, got {vocab}")
    # A sentence's 2K best extensions are among the 2K best tokens of each of its beams: rank
    # within rows first (n*B rows of V), then the B * 2K survivors of each sentence.
    row_scores, row_tok = row_topk(log_probs, 2 * k)  # (n*B, 2K), any order
    cand = (scores.view(-1, 1) + row_scores).view(n_act, beams * 2 * k)  # (n, B*2K)
    top_scores, top_idx = cand.topk(2 * k, dim=1)  # (n, 2K), best first
    top_tok = row_tok.view(n_act, beams * 2 * k).gather(1, top_idx)
    return top_scores, top_idx // (2 * k), top_tok


# Columns per block in :func:`row_topk` (2 threads, 8,000 columns, k 8: blocks of 64 took 77 /
# 136 / 178 us for 32 / 64 / 128 rows; of 32, 67 / 255 / 635; torch.topk 162 / 328 / 687).
_TOPK_BLOCK = 64


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest values of each row of ``x`` (R, V) and their columns, each (R, k).

    They come in any order, as ``x.topk(k, dim=1, sorted=False)`` returns them, in a half to a
    quarter of its time on a Multi30k vocabulary.

    ``topk`` over 8,000 columns costs about 690 us for 128 rows on 2 cores, more than the
    log-softmax before it. Ranked in two stages, a row is read once: the maximum of each block of
    64 columns, the ``k`` blocks with the largest maxima, then the ``k`` best of their ``64 k``
    columns (and the columns after the last whole block). That finds the same values: a block
    left out has a maximum below ``k`` values that were kept, so none of its values can be among
    the ``k`` largest. Where values tie, the columns returned may differ from ``topk``'s.
    """
    rows, width = x.shape
    blocks = width // _TOPK_BLOCK
    if blocks < 4 * k:  # too few blocks for two stages to save anything
        return x.topk(k, dim=1, sorted=False)
    body = x[:, : blocks * _TOPK_BLOCK].view(rows, blocks, _TOPK_BLOCK)
    best_blocks = body.amax(dim=2).topk(k, dim=1, sorted=False).indices  # (R, k)
    offsets = torch.arange(_TOPK_BLOCK, device=x.device)
    cols = (best_blocks[:, :, None] * _TOPK_BLOCK + offsets).view(rows, k * _TOPK_BLOCK)
    if width > blocks * _TOPK_BLOCK:  # the last, partial block is always a candidate
        tail = torch.arange(blocks * _TOPK_BLOCK, width, device=x.device).expand(rows, -1)
        cols = torch.cat([cols, tail], dim=1)
    values, pos = x.gather(1, cols).topk(k, dim=1, sorted=False)
    return values, cols.gather(1, pos)


def _end_hypotheses(
    ended: list[list[Hypothesis]],
    sentences: torch.Tensor,
    logp_sums: torch.Tensor,
    ids: torch.Tensor,
    finished: bool,
    alpha: float,
) -> None:
    """Add one ended hypothesis per row to ``ended``.

    Add to ``ended[sentence]`` one hypothesis per row: sentence indices (m,), summed log-probs
    (m,), generated ids without BOS (m, t); ``finished``: ended with EOS (not in ``ids``)."""
    for sentence, logp, row in zip(
        sentences.tolist(), logp_sums.tolist(), ids.tolist(), strict=True
    ):
        ended[sentence].append(_hypothesis(row, logp, finished, alpha))


def _best(hyps: list[Hypothesis], nbest: int) -> DecodeResult:
    """The ``nbest`` best of a sentence's ended hypotheses, by length-penalized score."""
    best = sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest]
    assert len(best) == nbest, "a done sentence always holds >= beam hypotheses"
    return DecodeResult(best)


def target_vocab(model: SearchModel) -> int:
    """The size of the target vocabulary of ``model`` (an ensemble's models share it)."""
    first = model.models[0] if isinstance(model, Ensemble) else model
    return first.config.dec_voc_size


def _never_written(model: SearchModel, eos_idx: int) -> set[int]:
    """The ids a constraint may not hold: PAD, BOS, EOS and the ids search never emits."""
    members = model.models if isinstance(model, Ensemble) else [model]
    tags = {t for m in members for t in m.never_emit}
    return {model.trg_pad_idx, model.trg_sos_idx, eos_idx, *tags}


@torch.inference_mode()
def constrained_beam_search(
    model: SearchModel,
    src: torch.Tensor,
    decode: DecodeConfig,
    constraints: Constraints,
    *,
    use_cache: bool = True,
    eos_idx: int = EOS_ID,
    prefixes: Prefixes | None = None,
    words: Words | None = None,
) -> list[DecodeResult]:
    """Beam search whose finished hypotheses contain each sentence's ``constraints``.

    ``constraints``: per row of ``src``, a list of target id sequences (possibly empty: that
    sentence is searched as :func:`beam_search` searches it, but for ties). The algorithm is in
    :mod:`~transformer_mt.decoding.constraints`; rows, the decoder state, finished sentences,
    length limits and scores are :func:`beam_search`'s. A sentence's budget is raised to its
    prefix, its constraint tokens and EOS where the length rule gives less, so that a
    hypothesis can meet them all; constraints that the position table cannot hold beside the
    prefix and EOS are an MTError naming the sentence, before any search. Every hypothesis
    returned meets its sentence's constraints (finished, or cut at the budget), by score, and
    ``decode.nbest`` of them, fewer where fewer met them. Where none did (the word rules left
    no way to write a term), the one result is the best hypothesis cut at the budget, with
    ``constraints_met=False``.

    Needs a beam of at least 2 (an MTError otherwise, and with ``decode.sampling``): with one
    hypothesis, the allocation always keeps the candidate furthest through the constraints, so
    the output would open with the constraints' tokens. (fairseq's code has no such check; its
    documentation runs beam 10, and advises a larger beam for constraints in any order, which
    these are.) An empty or out-of-vocabulary constraint, or one holding PAD, BOS, EOS or a
    language tag, is an MTError. ``words``: the vocabulary's word starts,
    for the word rules of :mod:`~transformer_mt.decoding.constraints` (None: none)."""
    _check_model(model)
    k = decode.beam_size
    forced = _forced(model, prefixes, src, eos_idx)
    # Room for constraint tokens: the position table less each prefix and EOS.
    most = model.positions.max_len - 1
    room = [most - len(prefix) for prefix in prefixes] if prefixes else [most] * src.size(0)
    table = ConstraintTable.of(
        constraints,
        src,
        vocab=target_vocab(model),
        banned=_never_written(model, eos_idx),
        words=words,
        room=room,
    )
    if table is not None and (decode.sampling or k < 2):
        raise MTError(
            "lexical constraints need beam search with a beam of at least 2 (--beam 2 or more, "
            "no --sample): with one hypothesis the terms would open every translation"
        )
    if table is None:
        return beam_search(
            model, src, decode, use_cache=use_cache, eos_idx=eos_idx, prefixes=prefixes
        )
    beams = _Beams.start(model, src, decode, use_cache, forced, extra_len=table.totals)
    beams.terms = ConstraintRows.start(table, beams.sent)  # one row per sentence at step 0
    ended: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]

    for step in range(int(beams.max_lens.max())):
        log_probs = beams.log_probs(step)  # (n*B, V): B = 1 at step 0, else K
        ranked = _allocated_candidates(beams, log_probs, table, step, eos_idx)
        scores, beam, tok, valid, _ = ranked  # (n, N) each, in the allocation's order

        end_mask = (tok[:, :k] == eos_idx) & valid[:, :k]  # EOS among the first K ends one
        if bool(end_mask.any()):
            i_idx, j_idx = end_mask.nonzero(as_tuple=True)
            rows = i_idx * k + beam[i_idx, j_idx]
            ids, logp = beams.tokens[rows, 1:], scores[i_idx, j_idx]
            met = torch.ones_like(i_idx, dtype=torch.bool)  # EOS is masked until all are met
            _end_constrained(ended, beams.sent[i_idx], logp, ids, True, met, decode.len_penalty)

        reorder = _keep_allocated(beams, ranked, eos_idx)  # (n*K,)

        at_max = (beams.max_lens <= step + 1) & ~beams.retired  # (n,)
        if bool(at_max.any()):
            i_idx = at_max.nonzero().squeeze(1)
            rows = beams.rows(i_idx)  # (m*K,)
            ids, logp = beams.tokens[rows, 1:], beams.scores[i_idx].view(-1)
            sentences = beams.sent[i_idx].repeat_interleave(k)
            met = beams.terms.select(rows).all_met()
            _end_constrained(ended, sentences, logp, ids, False, met, decode.len_penalty)
        n_ended = torch.tensor([len(ended[s]) for s in beams.sent.tolist()], device=src.device)
        if not beams.follow(reorder, beams.retired | at_max | (n_ended >= k)):
            break

    return [_best_constrained(hyps, decode.nbest) for hyps in ended]


# A constrained step's candidates, (n, N) each in the allocation's order: summed scores, beam,
# token, validity, and the constraint state each reaches (n*N rows, in the same order).
_Ranked = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ConstraintRows]


def _allocated_candidates(
    beams: _Beams, log_probs: torch.Tensor, table: ConstraintTable, step: int, eos_idx: int
) -> _Ranked:
    """The candidates of step ``step``, in the dynamic beam allocation's order.

    ``log_probs`` (n*B, V): the next-token log-probs of the beams that expand (B = K, or 1 at
    step 0); EOS is masked (in place) where a beam has unmet constraints. A candidate whose
    bank cannot grow to its sentence's constraint tokens in the steps its budget leaves after
    this one comes after those that can (:func:`allocation_order`)."""
    k = beams.k
    n_act = beams.scores.size(0)
    n_beams = log_probs.size(0) // n_act
    assert beams.terms is not None, "a constrained search keeps each row's constraint state"
    terms = beams.terms  # n*B rows
    rows_sent = beams.sent.repeat_interleave(n_beams)  # (n*B,)
    log_probs = terms.mask_continuations(terms.mask_eos(log_probs, eos_idx), table)
    log_probs = terms.mask_detours(log_probs, table, rows_sent)
    scores, beam, tok, valid = _constrained_candidates(
        beams.scores[:, :n_beams], log_probs, terms, table, rows_sent, k
    )  # (n, N) each
    n_cand = beam.size(1)
    sentences = torch.arange(n_act, device=beam.device)[:, None]
    states = terms.select((sentences * n_beams + beam).view(-1))
    cand_sent = beams.sent.repeat_interleave(n_cand)  # (n*N,)
    states = states.advance(table, cand_sent, tok.view(-1))
    banks = states.bank(table, cand_sent).view_as(beam)
    # A bank grows by at most one token a step: below this, the constraints are out of reach.
    short = table.totals[beams.sent] - (beams.max_lens - (step + 1))  # (n,)
    order = allocation_order(scores, banks, valid, table.most_tokens, short)
    states = states.select((sentences * n_cand + order).view(-1))
    return (
        scores.gather(1, order),
        beam.gather(1, order),
        tok.gather(1, order),
        valid.gather(1, order),
        states,
    )


def _keep_allocated(beams: _Beams, ranked: _Ranked, eos_idx: int) -> torch.Tensor:
    """Extend the beams with the first K non-EOS candidates in the allocation's order.

    Beams, scores and constraint states follow (an invalid candidate kept where too few are
    valid scores -inf). Returns the row each new row continues (n*K,), as
    :meth:`_Beams.advance` does."""
    scores, beam, tok, valid, states = ranked
    (n_act, n_cand), k = beam.shape, beams.k
    pos = torch.arange(n_cand, device=beam.device)
    later = torch.where(tok == eos_idx, pos + n_cand, pos)  # EOS after every other candidate
    live = later.topk(k, dim=1, largest=False).indices.sort(dim=1).values  # (n, K)
    sentences = torch.arange(n_act, device=beam.device)[:, None]
    reorder = (sentences * k + beam.gather(1, live)).view(-1)  # (n*K,)
    tokens = beams.tokens.index_select(0, reorder)
    beams.tokens = torch.cat([tokens, tok.gather(1, live).view(-1, 1)], dim=1)
    beams.scores = scores.gather(1, live).masked_fill(~valid.gather(1, live), float("-inf"))
    beams.terms = states.select((sentences * n_cand + live).view(-1))  # (n*K,)
    return reorder


def _constrained_candidates(
    scores: torch.Tensor,
    log_probs: torch.Tensor,
    terms: ConstraintRows,
    table: ConstraintTable,
    rows_sent: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A constrained step's candidates per sentence, unordered.

    From the summed scores (n, B) of the B beams that expand, their next-token log-probs
    (n*B, V) and constraint states (n*B rows, of sentences ``rows_sent``): the 2K best
    extensions of each sentence, each beam's best token and each beam's tokens that advance
    a constraint (:meth:`ConstraintRows.next_tokens`). Returns summed scores, beam index, token
    and validity (finite, first of its (beam, token), a real candidate), each (n, N), N >= 2K."""
    (n_act, n_beams), vocab = scores.shape, log_probs.size(1)
    width = min(2 * k, vocab)
    row_scores, row_tok = row_topk(log_probs, width)  # (n*B, w), any order
    flat = (scores.reshape(-1, 1) + row_scores).view(n_act, n_beams * width)
    top_scores, top_idx = flat.topk(min(2 * k, n_beams * width), dim=1)  # (n, <= 2K)
    top_beam = top_idx // width
    top_tok = row_tok.view(n_act, -1).gather(1, top_idx)
    best = row_scores.argmax(dim=1, keepdim=True)  # (n*B, 1): each beam's best token
    best_tok = row_tok.gather(1, best).view(n_act, n_beams)
    best_scores = (scores.reshape(-1, 1) + row_scores.gather(1, best)).view(n_act, n_beams)
    next_tok, next_valid = terms.next_tokens(table, rows_sent)  # (n*B, 2M)
    next_scores = scores.reshape(-1, 1) + log_probs.gather(1, next_tok)
    beam_ids = torch.arange(n_beams, device=scores.device)
    parts = [
        (top_scores, top_beam, top_tok, torch.ones_like(top_tok, dtype=torch.bool)),
        (
            best_scores,
            beam_ids.expand(n_act, -1),
            best_tok,
            torch.ones_like(best_tok, dtype=torch.bool),
        ),
        (
            next_scores.view(n_act, -1),
            beam_ids.repeat_interleave(next_tok.size(1)).expand(n_act, -1),
            next_tok.view(n_act, -1),
            next_valid.view(n_act, -1),
        ),
    ]
    short = 2 * k - sum(p[0].size(1) for p in parts)
    if short > 0:  # a tiny vocabulary: pad with invalid candidates up to 2K
        pad = torch.zeros((n_act, short), dtype=torch.long, device=scores.device)
        parts.append((pad.float(), pad, pad, pad.bool()))
    cand_scores, cand_beam, cand_tok, valid = (
        torch.cat(p, dim=1) for p in zip(*parts, strict=True)
    )
    valid &= cand_scores.isfinite()
    valid = drop_duplicates(cand_beam * vocab + cand_tok, valid)
    return cand_scores, cand_beam, cand_tok, valid


def _end_constrained(
    ended: list[list[Hypothesis]],
    sentences: torch.Tensor,
    logp_sums: torch.Tensor,
    ids: torch.Tensor,
    finished: bool,
    met: torch.Tensor,
    alpha: float,
) -> None:
    """:func:`_end_hypotheses` with each row's ``constraints_met`` (m,).

    Rows at -inf (beams that no candidate could fill) end nothing."""
    for sentence, logp, row, ok in zip(
        sentences.tolist(), logp_sums.tolist(), ids.tolist(), met.tolist(), strict=True
    ):
        if logp != float("-inf"):
            ended[sentence].append(_hypothesis(row, logp, finished, alpha, ok))


def _best_constrained(hyps: list[Hypothesis], nbest: int) -> DecodeResult:
    """The ``nbest`` best of a sentence's ended hypotheses that meet its constraints.

    By length-penalized score; fewer where fewer met them. Where none did, the best one alone
    (``constraints_met=False``: the caller says which terms it lacks)."""
    assert hyps, "a done sentence holds at least one hypothesis"
    met = [h for h in hyps if h.constraints_met]
    best = sorted(met or hyps, key=lambda h: h.score, reverse=True)
    return DecodeResult(best[: nbest if met else 1])


def search(
    model: SearchModel,
    src: torch.Tensor,
    decode: DecodeConfig,
    *,
    line_keys: Sequence[int] | None = None,
    use_cache: bool = True,
    prefixes: Prefixes | None = None,
    constraints: Constraints | None = None,
    words: Words | None = None,
) -> list[DecodeResult]:
    """Run the search that ``decode`` asks for.

    The search ``decode`` asks for: :func:`sample` when ``decode.sampling`` (each row's draws
    keyed by ``line_keys``), :func:`greedy_search` at beam size 1, else :func:`beam_search`; each
    output starts with its sentence's forced prefix, if ``prefixes`` are given (one per row of
    ``src``). With ``constraints`` (one list per row of ``src``) where a sentence has one:
    :func:`constrained_beam_search` (beam >= 2, no sampling, else an MTError), with the word
    rules where ``words`` are given."""
    if constraints is not None and any(len(c) for c in constraints):
        return constrained_beam_search(
            model,
            src,
            decode,
            constraints,
            use_cache=use_cache,
            prefixes=prefixes,
            words=words,
        )
    if decode.sampling:
        return sample(
            model, src, decode, line_keys=line_keys, use_cache=use_cache, prefixes=prefixes
        )
    if decode.beam_size == 1:
        return greedy_search(model, src, decode, use_cache=use_cache, prefixes=prefixes)
    return beam_search(model, src, decode, use_cache=use_cache, prefixes=prefixes)
