"""``python -m transformer_mt`` runs the `mt` CLI (so ``torchrun -m transformer_mt train`` works)."""

from transformer_mt.cli import app

app(prog_name="mt")
