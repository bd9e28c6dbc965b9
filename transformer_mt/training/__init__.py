"""Training: the loop, Noam schedule, label-smoothed loss, checkpoints, distributed helpers."""
