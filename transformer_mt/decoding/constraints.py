"""Lexical constraints: target token sequences that every finished hypothesis must contain.

A sentence's constraints are a list of target id sequences (a glossary term's target pieces, no
BOS/EOS); an empty list leaves the sentence unconstrained. A finished hypothesis contains each
constraint contiguously, the constraints in any order and non-overlapping (a constraint listed
twice must appear twice). The search (``constrained_beam_search`` in
:mod:`~transformer_mt.decoding.search`) is Post & Vilar's (2018) with the dynamic beam
allocation of Hu et al. (2019), as fairseq's ``--constraints unordered`` runs it (fairseq's
default keeps the constraints in the order given; here any order goes), vectorized over every
row of the batch with tensor operations (fairseq loops over sentences and beams in Python):

- EOS is masked (-inf) for every hypothesis that has not met all its constraints (and tokens by
  the word rules below).
- Each step's candidates per sentence: the 2K best extensions over its beams (as plain beam
  search), each beam's best token, and for each beam the tokens that continue or start one of
  its unmet constraints. Duplicates (the same beam and token) are dropped.
- Each candidate's *bank* is the number of constraint tokens it has produced: the tokens of the
  constraints it has met and of the longest one in progress. The candidates are ordered round
  robin over the banks, fullest bank first (the best of every bank, then the second best of
  every bank, ...); in that order the EOS candidates among the first K end hypotheses, and the
  first K others stay on the beam. Hypotheses that met more constraints are thus never crowded
  out by likelier ones that met fewer, and the best extension of the fullest bank always stays:
  while a beam can advance a constraint, the fullest bank grows by one token a step, so within
  ``total constraint tokens + 1`` steps some hypothesis meets them all (the search's budget is
  raised to that, after any forced prefix, within the position table; constraints that the
  position table cannot hold are an MTError before any search).
- A candidate whose bank is too empty for the steps its budget has left (a bank grows by at
  most one token a step) can never meet its constraints: it comes after every candidate that
  still can, and takes a beam only where too few of those are left. Otherwise the last steps
  keep beams that are bound to be cut without a term while hypotheses that hold them all are
  pushed off the beam.

Two rules on words, where the caller gives the vocabulary's word starts (:class:`Words`; for
sentencepiece, the ``▁`` pieces): a term is never left half way through a word (a hypothesis
whose match in progress goes on inside a word may only write the next token of a match in
progress: "www.hun" goes on with "de"; between a term's words it may be left, so that a term
opening with "a" does not take the first "a" written), and a term ends a word (right after a
constraint is met, the tokens that go on with a word are masked: "Haus" is never the start of
"Hauses"). A row that either rule would leave with no token (a forced prefix) keeps its own.
On a model that never saw such spans, half-written starts otherwise crowd the beam, since the
allocation favours hypotheses with more constraint tokens; fairseq's and Sockeye 2's searches let
any match be abandoned and started again.

A hypothesis that lacks a constraint never ends with EOS, and the n-best hold only hypotheses
that meet every constraint (finished, or cut at the budget): fewer than asked where fewer met
them. Where none did (rare: the rules of words left the search no way to write a term), the
sentence's one result is the best hypothesis cut at the budget, marked
``Hypothesis.constraints_met = False``; :func:`unmet` says which constraints it lacks.

Which constraint a token counts for (:meth:`ConstraintRows.advance`): each unmet constraint
follows its own KMP automaton over the tokens written since the last one was met. When tokens
complete an unmet constraint, the longest completed one is met (the first listed among equals),
unless another unmet constraint's match in progress is as long or longer (it may span the
completed one: that one is left to it; "2" to "2024" after "2"); meeting a constraint restarts every automaton, so met constraints never
overlap. Each rule only ever counts real, disjoint occurrences, so a hypothesis marked as meeting
its constraints contains them. The reverse does not always hold (exact counting would have to
try every assignment of occurrences): a constraint written inside another's longer match (``b``
inside ``a b c``, both constraints) is left to the longer one, and if that match then fails,
the shorter one must be written again elsewhere. fairseq's tracker (a trie over the
constraints) has the same kind of gap.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from transformer_mt.errors import MTError

Constraints = Sequence[Sequence[Sequence[int]]]
"""Per sentence, its constraints: each a non-empty sequence of target ids (no BOS/EOS)."""


@dataclass(frozen=True)
class Words:
    """Where the target vocabulary's words begin, for the search's two word rules.

    ``starts`` (V,) bool: the tokens that begin a word (sentencepiece's ``▁`` pieces);
    ``continues`` (V,) bool: the tokens that go on with the word before them (no ``▁``, and a
    first character of a word in a script with spaces). A model's vocabulary padded beyond
    them (for its products) is neither."""

    starts: torch.Tensor
    continues: torch.Tensor

    def fitted(self, vocab: int, device: torch.device) -> "Words":
        """These masks on ``device``, padded to ``vocab`` tokens (a ValueError if longer)."""
        masks = []
        for mask in (self.starts, self.continues):
            if mask.dim() != 1 or mask.numel() > vocab:
                raise ValueError(f"a word mask of shape {tuple(mask.shape)} for {vocab} tokens")
            masks.append(torch.nn.functional.pad(mask, (0, vocab - mask.numel())).to(device))
        return Words(masks[0], masks[1])


def check_constraints(
    constraints: Constraints,
    n_sent: int,
    vocab: int,
    banned: set[int],
    room: Sequence[int] | None = None,
) -> list[list[list[int]]]:
    """The constraints of ``n_sent`` sentences as lists, checked.

    A count other than ``n_sent`` is a ValueError (the caller's bug); an empty constraint, an
    id outside the target vocabulary ``0 .. vocab - 1`` or a ``banned`` id (PAD, BOS, EOS, a
    language tag: ids search never writes) is an MTError naming the sentence and constraint.
    ``room``: per sentence, the most constraint ids its output can hold (the position table
    less its prefix and EOS); a sentence whose constraints hold more is an MTError, checked
    before anything else (the search's tables grow with the square of a constraint's length)."""
    if len(constraints) != n_sent:
        raise ValueError(f"{len(constraints)} constraint lists for {n_sent} sentences: one each")
    for i, most in enumerate(room if room is not None else []):
        total = sum(len(ids) for ids in constraints[i])
        if total > most:
            raise MTError(
                f"sentence {i}: its constraints hold {total} target ids, and its output has room "
                f"for {max(most, 0)} (the position table less its prefix and EOS): drop or "
                "shorten some"
            )
    checked = []
    for i, sentence in enumerate(constraints):
        for j, ids in enumerate(sentence):
            where = f"sentence {i}, constraint {j}"
            if len(ids) == 0:
                raise MTError(f"{where} is empty: a constraint needs at least one target id")
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise MTError(
                    f"{where}: id {bad[0]} is outside the target vocabulary (0..{vocab - 1})"
                )
            never = sorted(banned.intersection(ids))
            if never:
                raise MTError(
                    f"{where}: id {never[0]} is PAD, BOS, EOS or a language tag, which search "
                    "never writes"
                )
        checked.append([[int(t) for t in ids] for ids in sentence])
    return checked


def kmp_steps(ids: Sequence[int]) -> list[list[int]]:
    """The KMP automaton of ``ids`` (n tokens): ``steps[p][k]``, for states p in 0..n and k < n.

    State p: the last p tokens read are ``ids[:p]``, and no longer prefix of ``ids`` ends there
    (n: a whole match). ``steps[p][k]`` is the state after reading ``ids[k]`` in state p; a token
    not in ``ids`` leads to state 0."""
    n = len(ids)
    border = [0] * (n + 1)  # border[p]: the longest proper prefix of ids[:p] that ends it
    for p in range(2, n + 1):
        q = border[p - 1]
        while q and ids[q] != ids[p - 1]:
            q = border[q]
        border[p] = q + 1 if ids[q] == ids[p - 1] else 0
    steps: list[list[int]] = []
    for p in range(n + 1):
        # Extend the match where the token continues it, else fall back to the border's state.
        steps.append(
            [
                p + 1 if p < n and ids[p] == ids[k] else (0 if p == 0 else steps[border[p]][k])
                for k in range(n)
            ]
        )
    return steps


@lru_cache(maxsize=4096)
def _cached_steps(ids: tuple[int, ...]) -> list[list[int]]:
    """:func:`kmp_steps`, kept for a glossary's terms that come back (never modify the lists)."""
    return kmp_steps(ids)


def _padded_steps(ids: list[int], width: int) -> list[list[int]]:
    """:func:`kmp_steps` of ``ids`` padded with zeros to ``width + 1`` states of ``width``."""
    pad = [0] * (width - len(ids))
    rows = [row + pad for row in _cached_steps(tuple(ids))]
    return rows + [[0] * width for _ in range(width + 1 - len(rows))]


class ConstraintTable:
    """The constraints of a batch as tensors, by sentence (its row in ``src``).

    M is the most constraints a sentence has, L the longest constraint; a sentence with fewer
    has empty slots (length 0), which count as met."""

    def __init__(
        self,
        constraints: list[list[list[int]]],
        device: torch.device,
        words: Words | None = None,
    ) -> None:
        m = max(1, max(len(c) for c in constraints))
        width = max((len(ids) for c in constraints for ids in c), default=1)
        no_slot: list[int] = []  # an empty slot
        slots: list[list[list[int]]] = [c + [no_slot] * (m - len(c)) for c in constraints]
        # Built as nested lists and converted once: a tensor write per constraint costs more.
        ids = [[seq + [-1] * (width - len(seq)) for seq in c] for c in slots]
        steps = [[_padded_steps(seq, width) for seq in c] for c in slots]
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)  # (B, M, L), -1: none
        self.lens = torch.tensor([[len(seq) for seq in c] for c in slots], device=device)  # (B, M)
        self.steps = torch.tensor(steps, dtype=torch.long, device=device)  # (B, M, L+1, L)
        self.totals = self.lens.sum(dim=1)  # (B,) constraint tokens of each sentence
        self.most_tokens = int(self.totals.max())  # the fullest bank any hypothesis can reach
        # The vocabulary's word starts, for the word rules (the module's text); None: no rules.
        self.words = words

    @classmethod
    def of(
        cls,
        constraints: Constraints | None,
        src: torch.Tensor,
        *,
        vocab: int,
        banned: set[int],
        words: Words | None = None,
        room: Sequence[int] | None = None,
    ) -> "ConstraintTable | None":
        """The checked constraints (:func:`check_constraints`) of the sentences of ``src`` (B, S).

        None when no sentence has one: search then runs exactly as without constraints.
        ``words``: the vocabulary's word starts (:class:`Words`), or None for no word rules;
        ``room``: per sentence, the most constraint ids its output can hold."""
        if constraints is None:
            return None
        checked = check_constraints(constraints, src.size(0), vocab, banned, room)
        if not any(checked):
            return None
        fitted = None if words is None else words.fitted(vocab, src.device)
        return cls(checked, src.device, fitted)


@dataclass
class ConstraintRows:
    """Where each hypothesis (row) stands with its sentence's constraints.

    ``progress`` (R, M): the state of each constraint's KMP automaton (0 for met ones), ``met``
    (R, M): met, or an empty slot; ``closed`` (R,): the row's last token met a constraint."""

    progress: torch.Tensor
    met: torch.Tensor
    closed: torch.Tensor

    @classmethod
    def start(cls, table: ConstraintTable, sent: torch.Tensor) -> "ConstraintRows":
        """Fresh rows for sentences ``sent`` (R,): nothing written yet."""
        lens = table.lens[sent]  # (R, M)
        return cls(torch.zeros_like(lens), lens == 0, torch.zeros_like(sent, dtype=torch.bool))

    def select(self, index: torch.Tensor) -> "ConstraintRows":
        """Rows ``index`` (R',)."""
        return ConstraintRows(self.progress[index], self.met[index], self.closed[index])

    def all_met(self) -> torch.Tensor:
        """(R,) bool: the row has met every constraint of its sentence."""
        return self.met.all(dim=1)

    def bank(self, table: ConstraintTable, sent: torch.Tensor) -> torch.Tensor:
        """(R,) constraint tokens written: those of met constraints and the longest in progress.

        ``sent`` (R,): each row's sentence."""
        met_tokens = (table.lens[sent] * self.met).sum(dim=1)
        return met_tokens + self.progress.masked_fill(self.met, 0).amax(dim=1)

    def mask_eos(self, log_probs: torch.Tensor, eos_idx: int) -> torch.Tensor:
        """``log_probs`` (R, V) with EOS at -inf for rows with unmet constraints (in place)."""
        log_probs[:, eos_idx].masked_fill_(~self.all_met(), float("-inf"))
        return log_probs

    def mask_detours(
        self, log_probs: torch.Tensor, table: ConstraintTable, sent: torch.Tensor
    ) -> torch.Tensor:
        """``log_probs`` (R, V) with only the next tokens of matches in progress, mid-word.

        In rows where a match in progress goes on inside a word (its next token starts no
        word), every token but the next ones of the matches in progress at -inf, in place;
        ``sent`` (R,): the rows' sentences. A term is never left half way through a word: "www.
        hun" goes on with "de", "Die unend" with "liche"; between its words it may be left (its
        first word may be an ordinary one: "a" of "a blue shirt"). No change without
        ``table.words``."""
        if table.words is None:
            return log_probs
        # (R, M): a match in progress (not one complete but left to a longer one)
        going = ~self.met & (self.progress > 0) & (self.progress < table.lens[sent])
        rows = going.any(dim=1).nonzero().squeeze(1)  # (k,): usually a few of the R
        if rows.numel() == 0:
            return log_probs
        ids, going = table.ids[sent[rows]], going[rows]
        at = self.progress[rows].clamp(max=ids.size(2) - 1)[..., None]
        following = ids.gather(2, at).squeeze(2).clamp(min=0)  # (k, M)
        inside = (going & ~table.words.starts[following]).any(dim=1)  # (k,): mid-word
        row, slot = going.nonzero(as_tuple=True)
        allowed = torch.zeros(
            (rows.numel(), log_probs.size(1)), dtype=torch.bool, device=log_probs.device
        )
        allowed[row, following[row, slot]] = True
        return _masked_rows(log_probs, rows[inside], ~allowed[inside])

    def mask_continuations(self, log_probs: torch.Tensor, table: ConstraintTable) -> torch.Tensor:
        """``log_probs`` (R, V) with the tokens that go on with a word at -inf after a term.

        In rows whose last token met a constraint, in place: a term ends a word ("Haus" is not
        met by "Hauses"). No change without ``table.words``."""
        if table.words is None:
            return log_probs
        rows = self.closed.nonzero().squeeze(1)
        blocked = table.words.continues[None, :].expand(rows.numel(), -1)
        return _masked_rows(log_probs, rows, blocked)

    def next_tokens(
        self, table: ConstraintTable, sent: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens that advance each row: ids (R, 2M) and whether each is one (R, 2M).

        Per unmet constraint, its next token (none where it is complete but left to a longer
        match, see the module's text) and its first token (a fresh start, where a match is in
        progress); the ids of the other entries are arbitrary (never negative)."""
        ids, lens = table.ids[sent], table.lens[sent]  # (R, M, L), (R, M)
        at = self.progress.clamp(max=ids.size(2) - 1)[..., None]  # (R, M, 1)
        following = ids.gather(2, at).squeeze(2)  # (R, M)
        first = ids[:, :, 0]
        valid = torch.cat([~self.met & (self.progress < lens), ~self.met & (self.progress > 0)], 1)
        return torch.cat([following, first], dim=1).clamp(min=0), valid

    def advance(
        self, table: ConstraintTable, sent: torch.Tensor, tokens: torch.Tensor
    ) -> "ConstraintRows":
        """The rows after each writes its token ``tokens`` (R,); ``sent`` (R,): their sentences.

        Each unmet constraint's automaton reads the token; the longest constraint it completes
        is met unless a longer match is in progress, and meeting one restarts every automaton
        (the module's text says why)."""
        ids, lens = table.ids[sent], table.lens[sent]  # (R, M, L), (R, M)
        same = ids == tokens[:, None, None]  # (R, M, L)
        # Every position holding the token leads to the same state: take the first.
        k = same.to(torch.uint8).argmax(dim=2)  # (R, M)
        slots = torch.arange(lens.size(1), device=lens.device)
        steps = table.steps[sent[:, None], slots, self.progress, k]  # (R, M)
        progress = torch.where(same.any(dim=2) & ~self.met, steps, 0)
        completed = torch.where((progress == lens) & ~self.met, lens, 0)  # (R, M)
        slot = completed.argmax(dim=1)  # (R,) the first of the longest completed
        longest = completed.gather(1, slot[:, None]).squeeze(1)
        # Met unless another match in progress is as long or longer (it may hold this one):
        # "2" is left to "2024" after "2", and met only if "2024" fails.
        others = progress.masked_fill((completed > 0) | self.met, 0).amax(dim=1)
        meets = (longest > 0) & (others < longest)  # (R,)
        chosen = torch.nn.functional.one_hot(slot, lens.size(1)).bool() & meets[:, None]
        progress = progress.masked_fill(meets[:, None], 0)
        return ConstraintRows(progress, self.met | chosen, meets)


def unmet(constraints: list[list[int]], tokens: Sequence[int]) -> list[int]:
    """The indices of the ``constraints`` (one sentence's) that ``tokens`` does not meet.

    By the rule the search counts them with (:meth:`ConstraintRows.advance`), token by token:
    for the rare result that lacks some (the module's text)."""
    if not constraints:
        return []
    table = ConstraintTable([constraints], torch.device("cpu"))
    sent = torch.zeros(1, dtype=torch.long)
    rows = ConstraintRows.start(table, sent)
    for token in tokens:
        rows = rows.advance(table, sent, torch.tensor([token]))
    return [j for j, met in enumerate(rows.met[0].tolist()) if not met]


def _masked_rows(
    log_probs: torch.Tensor, rows: torch.Tensor, blocked: torch.Tensor
) -> torch.Tensor:
    """``log_probs`` with ``blocked`` (k, V) at -inf in rows ``rows`` (k,), in place.

    A row that would be left with no finite token (a forced prefix's token among the blocked)
    keeps its tokens: the search has no other way on."""
    if rows.numel() == 0:
        return log_probs
    kept = log_probs[rows].masked_fill(blocked, float("-inf"))
    left = (kept > float("-inf")).any(dim=1)
    log_probs[rows[left]] = kept[left]
    return log_probs


def drop_duplicates(keys: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``valid`` (n, N) without the later repeats of a key in a row of ``keys`` (n, N)."""
    n_cand = keys.size(1)
    # Invalid entries get distinct negative keys, so that they repeat nothing.
    unique = -1 - torch.arange(n_cand, device=keys.device)
    keys = torch.where(valid, keys, unique)
    sorted_keys, order = keys.sort(dim=1, stable=True)
    repeat = torch.zeros_like(valid)
    repeat[:, 1:] = sorted_keys[:, 1:] == sorted_keys[:, :-1]
    return valid & ~torch.zeros_like(valid).scatter_(1, order, repeat)


def allocation_order(
    scores: torch.Tensor,
    banks: torch.Tensor,
    valid: torch.Tensor,
    most: int,
    short: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dynamic beam allocation's order of each sentence's candidates.

    ``scores``, ``banks`` and ``valid`` are (n, N), the banks at most ``most``. Returns (n, N)
    candidate indices: the best valid candidate of each bank, fullest bank first, then the
    second best of each, and so on; invalid candidates last. ``short`` (n,): per sentence, the
    banks below it can no longer meet its constraints (the module's text): their candidates
    come after every other valid one, in the same round robin."""
    n_cand = scores.size(1)
    by_score = scores.masked_fill(~valid, float("-inf")).argsort(
        dim=1, descending=True, stable=True
    )
    bank = banks.masked_fill(~valid, -1).gather(1, by_score)
    by_bank = bank.argsort(dim=1, descending=True, stable=True)
    order = by_score.gather(1, by_bank)  # (n, N) by bank, then score, each descending
    bank = bank.gather(1, by_bank)
    # Rank within the bank: the distance to the bank's first entry.
    pos = torch.arange(n_cand, device=scores.device).expand_as(bank)
    first = torch.ones_like(valid)
    first[:, 1:] = bank[:, 1:] != bank[:, :-1]
    rank = pos - torch.where(first, pos, 0).cummax(dim=1).values
    top = most + 1  # a bound, not bank.max(): no wait for the device
    stripe = rank * top + (top - 1 - bank)  # round robin: rank first, then fuller bank first
    if short is not None:  # hopeless banks after every stripe of the others
        stripe = stripe + (bank < short[:, None]) * (n_cand * top)
    stripe = stripe.masked_fill(bank < 0, 2 * n_cand * top)  # invalid ones after everything
    return order.gather(1, stripe.argsort(dim=1, stable=True))
