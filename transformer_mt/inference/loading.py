"""Rebuild a trained model and its tokenizers from one checkpoint file, ready to translate."""

from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import Config, config_from_dict
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.model import Transformer


@dataclass
class LoadedModel:
    """Everything inference needs, rebuilt from one checkpoint file."""

    model: Transformer  # in eval mode, on the device it was loaded for
    src_tok: Tokenizer
    trg_tok: Tokenizer  # the same object as src_tok for a joint vocabulary
    config: Config  # the run's resolved config; ``config.decode`` holds its decoding defaults
    step: int  # optimizer steps the weights were trained for (0 when unknown)


def load_for_inference(path: Path | str, device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild the model (in eval mode, on ``device``) and tokenizers from a checkpoint.

    Loaded with ``weights_only=True``: a checkpoint from a stranger cannot run code.
    """
    ckpt = load_checkpoint(path)
    model = Transformer(**ckpt["model_args"])
    model.load_state_dict(ckpt["model"])  # older parameter names are upgraded by the model
    model.to(device).eval()
    src_tok = Tokenizer(ckpt["src_spm"])
    trg_tok = src_tok if ckpt["trg_spm"] == ckpt["src_spm"] else Tokenizer(ckpt["trg_spm"])
    return LoadedModel(
        model=model,
        src_tok=src_tok,
        trg_tok=trg_tok,
        config=config_from_dict(ckpt["config"]),
        step=int(ckpt.get("step", 0)),
    )
