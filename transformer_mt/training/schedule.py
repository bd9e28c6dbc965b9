"""Learning-rate schedules: Noam, and Noam's warm-up with a linear decay.

Learning-rate schedules: the Noam schedule of "Attention Is All You Need" (section 5.3), and
the same warm-up followed by a straight line down to zero at the end of the run's budget."""


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for optimizer step >= 1.

    It rises linearly for ``warmup_steps`` steps, peaks at step == warmup_steps, then decays with
    the inverse square root of the step. The caller counts *optimizer* steps, not micro-batches.
    """
    if step < 1:
        raise ValueError(f"Noam steps start at 1, got {step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def budget_left(
    step: int,
    max_steps: int,
    warmup_steps: int,
    seconds: float = 0.0,
    max_seconds: float = 0.0,
    warmup_seconds: float | None = None,
) -> float:
    """The fraction of the post-warm-up budget not yet spent at ``step``.

    ``step`` (>= 1) is the optimizer step being taken. The fraction is 1 right after warm-up and
    falls linearly to 0 at the end of the run.

    The run ends at ``max_steps`` or, when ``max_seconds`` > 0, once that much wall time is spent,
    whichever comes first; so the fraction is the smaller of the two. ``seconds`` is the time spent
    before this step and ``warmup_seconds`` the time spent when warm-up ended (None: not yet).
    """
    left = (max_steps - step + 1) / max(max_steps - warmup_steps, 1)
    if max_seconds > 0 and warmup_seconds is not None:
        seconds_after = max(max_seconds - warmup_seconds, 1e-9)
        left = min(left, (max_seconds - seconds) / seconds_after)
    return min(max(left, 0.0), 1.0)


def linear_decay_lr(
    step: int, d_model: int, warmup_steps: int, factor: float, left: float
) -> float:
    """Noam's warm-up, then a straight line to zero at the end of the budget.

    Noam's warm-up to its peak (``noam_lr`` at ``warmup_steps``), then peak * ``left``, where
    ``left`` is ``budget_left(...)``: a straight line to zero at the end of the budget.

    Annealing to zero where a fixed budget ends trains better than a schedule that does not know
    where it ends (Li et al., "Budgeted Training", ICLR 2020).
    """
    if step <= warmup_steps:
        return noam_lr(step, d_model, warmup_steps, factor)
    return noam_lr(warmup_steps, d_model, warmup_steps, factor) * left
