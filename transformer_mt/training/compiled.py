"""torch.compile for training: the repeated layers, one static graph per batch shape, each counted.

``train.compile`` compiles each encoder and decoder layer in place (regional compilation, the
layers' own ``compile``): the layers of a stack are one code with the same shapes, so one graph
serves them all, and a batch shape costs two compiles (an encoder layer's, a decoder layer's)
where the whole model was one large graph. On 1 CPU thread, a tiny model's first shape compiled
in 15 s against 91 s for the whole model, a second shape in 5.5 against 16 s. The embeddings,
the final norms and the loss run eagerly around them.

Shapes are static (``dynamic=False``: dynamic shapes compiled for minutes on an H200 before a first
step, and torch's automatic dynamic shapes would recompile once more for a generic graph). The
shapes a run meets are bounded by ``train.pad_to_multiple`` (:mod:`transformer_mt.data.batching`):
a handful of (rows, length) classes, each compiled at its first batch, all of them within the
first epoch (its batches come in shuffled order). :class:`CompileCounter` is the backend:
Inductor, with a count of the graphs it compiled, the seconds it took and their input shapes,
which the trainer logs and writes into its validation records (``compiled_graphs``,
``compile_s``).

``train.cuda_graphs`` has Inductor replay each compiled graph as a CUDA graph (its CUDA graph
trees: what ``mode="reduce-overhead"`` turns on), which static shapes allow; each training step
marks a new iteration (:func:`mark_step`), so that a replay may reuse the previous step's memory.

Validation and decoding run the same modules eagerly (:func:`eager`): their shapes (a search's
growing prefixes, evaluation mode) would each compile a graph of their own.
"""

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from transformer_mt.errors import MTError
from transformer_mt.model import Transformer

log = logging.getLogger(__name__)

# Graphs torch.compile keeps per compiled code before it falls back to running it eagerly (torch's
# default is 8): above the number of length classes a run can meet (lengths up to 1,024 at
# pad_to_multiple 8: 8 + 4 per doubling, 28 classes), so that no class runs uncompiled.
RECOMPILE_LIMIT = 64


class CompileCounter:
    """A torch.compile backend: Inductor, counting the graphs it compiles.

    A graph is a forward pass's; ``seconds`` is the time of their compiles (a graph's backward is
    compiled at its first backward pass, not counted here: the step time shows it)."""

    def __init__(self, backend: str = "inductor", cuda_graphs: bool = False) -> None:
        self.backend = backend  # the compiler that does the work (tests: aot_eager, quicker)
        self.cuda_graphs = cuda_graphs  # Inductor's CUDA graph trees (train.cuda_graphs)
        self.graphs = 0
        self.seconds = 0.0
        self.shapes: list[tuple[tuple[int, ...], ...]] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        started = time.perf_counter()
        compiled: Any
        if self.cuda_graphs and self.backend == "inductor":
            from torch._inductor import compile_fx

            patches = {"triton.cudagraphs": True}
            compiled = compile_fx.compile_fx(graph, example_inputs, config_patches=patches)
        else:
            compiled = torch._dynamo.lookup_backend(self.backend)(graph, example_inputs)
        spent = time.perf_counter() - started
        shapes = tuple(
            tuple(x.shape)
            for x in example_inputs
            if isinstance(x, torch.Tensor) and x.dim() == 3  # activations (B, T, D)
        )
        self.graphs += 1
        self.seconds += spent
        self.shapes.append(shapes)
        log.info(
            f"torch.compile: graph {self.graphs} compiled in {spent:.1f} s (activations "
            f"{', '.join('x'.join(map(str, s)) for s in sorted(set(shapes))) or 'none'})"
        )
        return compiled

    def record(self) -> dict[str, float]:
        """What a validation record says of compiling so far."""
        return {"compiled_graphs": self.graphs, "compile_s": round(self.seconds, 1)}


def compile_layers(model: Transformer, counter: CompileCounter) -> None:
    """Compile ``model``'s encoder and decoder layers in place.

    Static shapes, ``counter`` as the backend. The module tree, its parameters and
    ``state_dict`` stay as they were."""
    if not hasattr(torch.compiler, "set_stance"):  # validation's eager(): torch 2.6
        raise MTError(
            f"train.compile needs torch 2.6 or newer (this is {torch.__version__}); set "
            "train.compile=false"
        )
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    for layer in (*model.encoder, *model.decoder):
        layer.compile(backend=counter, dynamic=False)


def mark_step(counter: CompileCounter | None) -> None:
    """Start a training step's iteration of the CUDA graphs (where ``counter`` replays them).

    A replay may then overwrite what the previous step's graphs returned (all read by now)."""
    if counter is not None and counter.cuda_graphs:
        torch.compiler.cudagraph_mark_step_begin()


@contextmanager
def eager(compiled: bool = True) -> Iterator[None]:
    """Run compiled code eagerly inside the block (where ``compiled``; else nothing to do)."""
    with torch.compiler.set_stance("force_eager") if compiled else nullcontext():
        yield
