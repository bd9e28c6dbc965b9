"""The Noam learning-rate schedule of "Attention Is All You Need" (section 5.3)."""


def noam_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for optimizer step >= 1.

    It rises linearly for ``warmup_steps`` steps, peaks at step == warmup_steps, then decays with
    the inverse square root of the step. The caller counts *optimizer* steps, not micro-batches.
    """
    if step < 1:
        raise ValueError(f"Noam steps start at 1, got {step}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
