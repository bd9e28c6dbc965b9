"""The training loop: ``Trainer.run`` steps and delegates.

One optimizer step = ``accum_steps`` micro-batches on each rank. The loss of a step is the sum of
the label-smoothed token losses divided by the *global* number of non-pad target tokens of that
step (all micro-batches, all ranks), so 1 process with batch B equals N processes with B/N each.
The learning rate is set once per optimizer step.

Around the step, the loop makes a few named decisions: when to log (:meth:`Trainer._log_due`),
when to validate and checkpoint (:meth:`Trainer._validation_due`), and why to stop
(:meth:`Trainer._stop_reason`). Every way out (max_steps, the time budget, early stopping,
Ctrl-C / SIGTERM) leaves the loop with a :class:`StopReason` and goes through one exit,
:meth:`Trainer._finish`.

One writer per run: rank 0 holds the run directory's lock (:class:`RunLock`) from before the data
is prepared until the run ends, and a resume checks that the data and tokenizer are the ones the
checkpoint was trained on (:mod:`transformer_mt.training.fingerprint`).

A fine-tuning run (``train.init_from``) starts from a trained model's weights, tokenizers and shape
with a new optimizer and schedule (:mod:`transformer_mt.training.init_from`).

On an accelerator the step queues its work without waiting for the device: batches of a bounded
set of shapes (``train.pad_to_multiple``) arrive from pinned memory by non-blocking copies, the next
one prepared while the step runs (:class:`~transformer_mt.training.batches.DeviceBatches`); the
loss, the gradient norm and a step with a non-finite loss skipped stay on the device (fused AdamW's
``found_inf``), and the host reads a step's numbers once, after the next batch is on its way.
"""

import enum
import inspect
import logging
import math
import random
import signal
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from transformer_mt.checkpoint import load_checkpoint
from transformer_mt.config import Config
from transformer_mt.data.languages import tag_ids
from transformer_mt.data.mixing import MixedCorpus
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.sources import check_source
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID, SPECIAL_IDS
from transformer_mt.errors import MTError
from transformer_mt.host_memory import release_freed_memory, resident_mib
from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.training import distributed
from transformer_mt.training.batches import BatchStream, DeviceBatches
from transformer_mt.training.compiled import CompileCounter, compile_layers, eager, mark_step
from transformer_mt.training.device import (
    AUTOCAST_DTYPES,
    autocast,
    autocast_dtype,
    choose_precision,
    setup_process,
)
from transformer_mt.training.fingerprint import (
    check_data_settings,
    check_fingerprint,
    data_fingerprint,
)
from transformer_mt.training.init_from import (
    Start,
    check_data,
    find_start,
    load_weights,
)
from transformer_mt.training.loss import linear_label_smoothed_nll
from transformer_mt.training.metrics import MetricsWindow
from transformer_mt.training.resume import (
    apply_optimizer_settings,
    check_best_metric,
    check_model_args,
    check_training_state,
    realign_epoch,
    restore_generators,
)
from transformer_mt.training.run_dir import RunDirectory, RunLock, refuse_earlier_run
from transformer_mt.training.schedule import budget_left, linear_decay_lr, noam_lr
from transformer_mt.training.state import (
    StopFlag,
    StoppedBySignal,
    TrainState,
    rank_seed,
    rng_state,
)
from transformer_mt.training.validation import validate

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """One optimizer step, summed over micro-batches and ranks (identical on every rank)."""

    loss: float  # summed label-smoothed loss
    nll: float  # summed negative log-likelihood
    tokens: float  # non-pad target tokens
    grad_norm: float  # global gradient norm before clipping; nan for a skipped step
    stop: bool  # some rank was asked to stop (Ctrl-C, SIGTERM)
    time_up: bool  # rank 0 found train.max_minutes spent


class StopReason(enum.Enum):
    """Why the loop ended; every rank reaches the same one (the inputs are all-reduced)."""

    MAX_STEPS = "train.max_steps reached"
    TIME_UP = "train.max_minutes spent"
    EARLY_STOP = "no improvement in train.patience validations"
    SIGNAL = "stopped by Ctrl-C or SIGTERM"


class Trainer:
    """Holds the model, optimizer and state of one run; ``run()`` trains to ``max_steps``."""

    def __init__(
        self,
        cfg: Config,
        run_dir: str | Path,
        *,
        resume: bool = True,
        progress: bool = True,
        data: PreparedData | None = None,
        allow_data_change: bool = False,
    ) -> None:
        run_dir = Path(run_dir)  # a str (e.g. from tempfile.TemporaryDirectory) is accepted too
        self.cfg, self.progress = cfg, progress
        self.stop_signal: int | None = None  # the signal that stopped run(), if one did
        check_source(cfg)  # a wrong corpus name or file fails before any work or directory
        self.device, self.info, self.kept_freed_memory = setup_process(cfg.train)
        # Rank 0 locks the run directory before any work: a second `mt train` on it stops here,
        # before preparing data or touching the run's files.
        lock = lambda: self._lock_run_dir(run_dir, resume)  # noqa: E731
        self.lock: RunLock | None = distributed.main_first(lock, self.info, lambda: None)
        try:
            self._setup(cfg, run_dir, resume, data, allow_data_change)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _lock_run_dir(run_dir: Path, resume: bool) -> RunLock:
        """Lock ``run_dir``; a new run (no resume from its last.pt) must find no checkpoints."""
        lock = RunLock.acquire(run_dir)
        try:
            lock.remove_leftovers()
            if not (resume and (run_dir / "last.pt").is_file()):
                refuse_earlier_run(run_dir)
        except BaseException:
            lock.release()
            raise
        return lock

    def close(self) -> None:
        """Release the run directory (run() does, when it ends); idempotent."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _setup(
        self,
        cfg: Config,
        run_dir: Path,
        resume: bool,
        data: PreparedData | None,
        allow_data_change: bool,
    ) -> None:
        last, start = self._read_start(run_dir / "last.pt", resume, allow_data_change)
        self.precision, self.precision_why = self._choose_precision(cfg, last)
        self.autocast_dtype = autocast_dtype(self.precision, self.device)
        self.shape_multiple, self.vocab_multiple = self._padding(cfg)
        self.compile_counter: CompileCounter | None = None
        if start is not None:
            self.cfg = cfg = start.cfg  # the checkpoint's shape and tokenizer settings
        # What every checkpoint of a fine-tuning run repeats from its start.
        self.init_from = start.record if start is not None else None
        self.lang_tags = start.lang_tags if start is not None else None
        self.data = data if data is not None else self._prepare_data(start)
        if start is not None:
            check_data(start, self.data)
        self.lang_tags = self.data.lang_tags or self.lang_tags  # a multilingual model's tags
        self.fingerprint = data_fingerprint(self.data)
        self._check_ranks_prepared_alike()
        self.run_dir = RunDirectory(run_dir, cfg, self.info.is_main)
        self._build_model(start)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=0.0,
            betas=(cfg.train.adam_beta1, cfg.train.adam_beta2),
            eps=cfg.train.adam_eps,
            weight_decay=cfg.train.weight_decay,
            fused=self._fused_adam(),
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.state = TrainState()
        error: BaseException | None = None
        try:
            if last is not None:
                self._restore(self.run_dir.last, last, allow_data_change)
        except Exception as err:  # handed to every rank, then re-raised here
            error = err
        distributed.agree_on_error(error, self.info)
        self._check_ranks_agree()
        self.train_model = self._wrap_for_training(self.model)

    def _choose_precision(self, cfg: Config, last: dict[str, Any] | None) -> tuple[str, str]:
        """The run's precision and why.

        The config's, or for ``auto`` the one the run chose at its start (a resume computes as the
        uninterrupted run did), else the device's choice
        (:func:`~transformer_mt.training.device.choose_precision`), the same on every rank."""
        precision = cfg.train.precision
        if precision != "auto":
            return precision, "train.precision"
        chosen = (last or {}).get("train_state", {}).get("precision")
        if chosen in AUTOCAST_DTYPES or chosen == "fp32":
            return chosen, "auto: as the run chose at its start"
        rows = min(cfg.train.batch_tokens, 8192)
        model = cfg.model
        choice = choose_precision(self.device, model.d_model, model.ffn_hidden, rows, fp16=True)
        choices = distributed.all_gather_objects(choice, self.info, lockstep_op=False)
        if any(c[0] != choices[0][0] for c in choices):
            return "fp32", "auto: the ranks' probes disagreed"
        return choices[0][0], f"auto: {choices[0][1]}"

    def _padding(self, cfg: Config) -> tuple[int, int]:
        """The resolved ``train.pad_to_multiple`` and ``train.pad_vocab_to`` (null: by device).

        Bounded shapes on an accelerator, or wherever the model is compiled (a graph per shape);
        on a CPU run eagerly the batches stay as long as their longest sentence (oneDNN gains
        nothing from repeated shapes: docs/BENCHMARKS.md). The vocabulary padded to 64 rows on a
        GPU (tensor cores' tiles); on a CPU it would only add rows."""
        on_cpu = self.device.type == "cpu"
        shapes = cfg.train.pad_to_multiple
        if shapes is None:
            shapes = 0 if on_cpu and not cfg.train.compile else 8
        vocab = cfg.train.pad_vocab_to
        if vocab is None:
            vocab = 64 if self.device.type == "cuda" else 1
        return shapes, vocab

    def _read_start(
        self, last_path: Path, resume: bool, allow_data_change: bool
    ) -> tuple[dict[str, Any] | None, Start | None]:
        """The run's own last.pt when it resumes, and the start of a fine-tuning run.

        The start comes from that last.pt, or from train.init_from; both are read and checked
        (the resumed run's data settings too) before any data is prepared. A failure on any rank
        stops every rank with its message."""
        last: dict[str, Any] | None = None
        start: Start | None = None
        error: BaseException | None = None
        try:
            if resume and last_path.is_file():
                last = load_checkpoint(last_path, map_location=self.device)
            start = find_start(self.cfg, last, last_path)
            if last is not None:  # a fine-tuning run trains with its start's tokenizer settings
                cfg = start.cfg if start is not None else self.cfg
                check_data_settings(last_path, last, cfg, allow_data_change)
        except Exception as err:  # handed to every rank, then re-raised here
            error = err
        distributed.agree_on_error(error, self.info)
        return last, start

    def _check_ranks_prepared_alike(self) -> None:
        """Every rank must read the same tokenizers and batches.

        On several machines, each prepares its own copy unless data.cache_dir is shared, and copies
        can differ."""
        fingerprints = distributed.all_gather_objects(
            self.fingerprint, self.info, lockstep_op=False
        )
        differ = [rank for rank, theirs in enumerate(fingerprints) if theirs != fingerprints[0]]
        if differ:  # the same list on every rank: all of them stop
            raise MTError(
                f"ranks {differ} prepared other data or tokenizers than rank 0; with several "
                "machines, put data.cache_dir on storage that all of them share"
            )

    def _build_model(self, start: Start | None) -> None:
        """Build the model, as ``Transformer(TransformerConfig)``.

        The config's shape with random weights, or a fine-tuning start's shape (with the config's
        dropout rates) and weights.
        """
        seed, cfg = self.cfg.train.seed, self.cfg
        torch.manual_seed(seed)  # the same initial weights on every rank
        random.seed(seed)
        if start is None:
            model_config = TransformerConfig.build(
                cfg.model,
                self.data.src_tok.vocab_size,
                self.data.trg_tok.vocab_size,
                pad_idx=PAD_ID,
                bos_idx=BOS_ID,
            )
        else:
            model_config = start.model_config
        self.model = Transformer(model_config).to(self.device)
        self.model_args = model_config.to_args()  # what checkpoints store
        # Validation's search never emits a language tag, as inference's does not.
        self.model.never_emit = tag_ids(self.data.trg_tok, self.lang_tags or {})
        if start is not None:
            load_weights(self.model, start)
        torch.manual_seed(rank_seed(seed, self.info.rank))
        random.seed(rank_seed(seed, self.info.rank))

    def _prepare_data(self, start: Start | None) -> PreparedData:
        """Prepare the data: rank 0 first, then the others.

        Rank 0 prepares (downloads, trains sentencepiece, binarizes); the others then read the
        finished caches, so no two processes build the same files. If rank 0 fails (a missing
        file, a bad download), every rank stops with its message. A fine-tuning run encodes
        the data with its checkpoint's tokenizers instead of training its own."""
        toks = None if start is None else (start.src_tok, start.trg_tok)
        tags = None if start is None else start.lang_tags
        return distributed.main_first(
            lambda: prepare(self.cfg, progress=self.progress, tokenizers=toks, tags=tags),
            self.info,
            lambda: prepare(self.cfg, progress=False, tokenizers=toks, tags=tags),
        )

    def _wrap_for_training(self, model: Transformer) -> torch.nn.Module:
        """The module the step runs: its layers compiled and/or wrapped in DDP.

        ``self.model`` stays the model that checkpoints, validation and decoding use (with
        train.compile its layers are compiled in place; validation runs them eagerly)."""
        wrapped: torch.nn.Module = model
        if self.cfg.train.compile:
            cuda_graphs = self.cfg.train.cuda_graphs and self.device.type == "cuda"
            self.compile_counter = CompileCounter(cuda_graphs=cuda_graphs)
            compile_layers(model, self.compile_counter)
        if not self.info.enabled:
            return wrapped
        ids = [self.device.index] if self.device.type == "cuda" else None
        # The only buffer is the constant sinusoid table: broadcasting it before every forward
        # pass would cost a collective per micro-batch for nothing. (torch 2.13 renamed the
        # switch; older versions know only broadcast_buffers.)
        no_sync: dict[str, Any] = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DDP).parameters
            else {"broadcast_buffers": False}
        )
        return DDP(wrapped, device_ids=ids, process_group=self.info.step_group, **no_sync)

    # ----------------------------------------------------------------------------- checkpoints
    def _checkpoint(self, rng_per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """The checkpoint dict (see transformer_mt.checkpoint for the format)."""
        ckpt: dict[str, Any] = {
            "model": self.model.state_dict(),
            "model_args": self.model_args,
            "config": self.cfg.to_dict(),
            "src_spm": self.data.src_tok.model_proto,
            "trg_spm": self.data.trg_tok.model_proto,
            "special_ids": SPECIAL_IDS,
            "step": self.state.step,
            "train_state": {
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "state": asdict(self.state),
                "rng": rng_per_rank[0],
                # Each rank draws its own dropout masks; an exact resume restores each stream.
                "rng_per_rank": rng_per_rank,
                "data_fingerprint": self.fingerprint,  # what it was trained on (fingerprint.py)
                "precision": self.precision,  # what train.precision=auto chose, kept on resume
                # How its batches were cut (train.pad_to_multiple, resolved): a resume with
                # another cut starts the next epoch (resume.realign_epoch).
                "pad_to_multiple": self.shape_multiple,
            },
        }
        if self.init_from is not None:  # a fine-tuning run: the file it started from
            ckpt["train_state"]["init_from"] = self.init_from
        if self.lang_tags is not None:
            ckpt["lang_tags"] = self.lang_tags
        return ckpt

    def _fused_adam(self) -> bool:
        """Whether AdamW runs fused.

        One kernel over all parameters instead of a loop of per-tensor operations (on 2 CPU cores
        4-5 ms against 10-16 ms per step for the Multi30k model; docs/BENCHMARKS.md). CPU and CUDA
        have the kernel."""
        return self.device.type in ("cpu", "cuda")

    def _check_ranks_agree(self) -> None:
        """Every rank must resume from the same state.

        Each reads ``last.pt`` from its own view of the run directory and only rank 0 writes it, so
        machines that do not share the run directory would train diverged replicas, from different
        steps or from different runs that reached the same step (their states differ: history,
        training time)."""
        states = distributed.all_gather_objects(asdict(self.state), self.info, lockstep_op=False)
        other = next((r for r, s in enumerate(states) if s != states[0]), None)
        if other is not None:
            raise MTError(
                f"rank {other} resumes another run state (step {states[other]['step']}) than "
                f"rank 0 (step {states[0]['step']}): the ranks see different files in "
                f"{self.run_dir.path}; put --run-dir on storage that every machine shares"
            )

    def _restore(self, path: Path, ckpt: dict[str, Any], allow_data_change: bool) -> None:
        """Continue the run from its own last.pt ``ckpt`` (read from ``path``).

        Weights, optimizer, scaler, state and generators, after checking that it fits this
        config."""
        check_training_state(path, ckpt)
        data_changed = check_fingerprint(path, ckpt, self.fingerprint, self.cfg, allow_data_change)
        check_model_args(path, ckpt["model_args"], self.model_args)
        self.model.load_state_dict(ckpt["model"])
        saved = ckpt["train_state"]
        # A saved parameter group carries the implementation it ran with, and loading it would
        # bring that back; this process's choice holds instead (a run saved before fused AdamW,
        # or on another device, resumes fused; a non-fused one under fp16's gradient scaler
        # would refuse the scaler's arguments).
        for group in saved["optimizer"]["param_groups"]:
            group.update(fused=self._fused_adam(), foreach=None)
        self.optimizer.load_state_dict(saved["optimizer"])
        apply_optimizer_settings(self.optimizer, self.cfg.train, path)
        if saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])
        elif self.scaler.is_enabled():  # saved by a run without fp16: its scaler was disabled
            log.info(f"{path} was trained without fp16: the gradient scaler starts afresh")
        self.state = TrainState(**saved["state"])
        saved_cfg = ckpt.get("config", {})
        metric = self.cfg.train.best_metric
        check_best_metric(self.state, metric, path, saved_cfg.get("train", {}).get("best_metric"))
        per_rank = saved.get("rng_per_rank", [saved["rng"]])
        worlds = len(per_rank), self.info.world_size
        # The cut as resolved (null: by device); runs saved before bounded shapes had none.
        saved_train = {
            **saved_cfg.get("train", {}),
            "pad_to_multiple": saved.get("pad_to_multiple", 0),
        }
        now_cfg = self.cfg.to_dict()
        now_cfg["train"]["pad_to_multiple"] = self.shape_multiple
        saved_cfg = {**saved_cfg, "train": saved_train}
        realign_epoch(self.state, path, saved_cfg, now_cfg, worlds, data_changed)
        reseed = self.cfg.train.seed + self.state.step  # another process count's other ranks
        restore_generators(per_rank, self.info.rank, self.info.world_size, self.device, reseed)
        log.info(f"resuming {path} at step {self.state.step} (epoch {self.state.epoch})")

    def _save(self, best: bool, step_file: bool = True) -> None:
        """Write last.pt, step_N.pt (and best.pt); a collective: every rank calls it, rank 0 writes.

        A failed write (disk full) stops every rank with rank 0's message instead of leaving the
        others to wait in the next collective.
        """
        rngs = distributed.all_gather_objects(rng_state(self.device), self.info)
        write = lambda: self.run_dir.save(  # noqa: E731
            self._checkpoint(rngs), self.state.step, best, step_file
        )
        distributed.main_first(write, self.info, lambda: None)

    # ---------------------------------------------------------------------------------- step
    def train_step(
        self,
        micro_batches: list[tuple[torch.Tensor, ...]],
        stop_requested: bool,
        seconds: float,
        *,
        tokens: list[int] | None = None,
        before_read: Callable[[], None] | None = None,
    ) -> StepResult:
        """One optimizer step on this rank's ``micro_batches`` (src, trg_in, trg_out).

        ``seconds`` of training time were spent before it; the result is the same on every rank
        (sums over all ranks), and so is every decision taken from it. ``tokens``: each
        micro-batch's non-pad target tokens, where the caller counted them on the host (batches
        already on a GPU would otherwise be counted there, with a wait). ``before_read`` runs
        once the step's work is queued and before its numbers are read (the next batch's copy).

        A step whose loss is not finite changes no weight: on one process with a fused AdamW
        the optimizer skips it on the device (its ``found_inf``, as under fp16's gradient scaler),
        so that nothing in the step waits for the device; otherwise the loss is read first."""
        mark_step(self.compile_counter)
        if tokens is None:
            tokens = [int((out != PAD_ID).sum()) for _, _, out in micro_batches]
        (global_tokens,) = distributed.all_reduce_sum([float(sum(tokens))], self.info, self.device)
        sums = self._backward(micro_batches, global_tokens)  # (micro-batches, 2): loss, nll
        if self.info.enabled or not self._fused_adam():
            return self._step_after_reading(
                sums, global_tokens, stop_requested, seconds, before_read
            )
        # One process, fused AdamW: the skip of a non-finite step is decided on the device.
        loss_total = sums[:, 0].sum()
        nonfinite = loss_total.isfinite().logical_not()
        self.scaler.unscale_(self.optimizer)  # fp16: the norm and the clipping see true gradients
        grad_norm = self._clip_gradients()
        self._set_lr(self.state.step + 1, seconds)
        if self.scaler.is_enabled():
            # The scaler skips a step with non-finite gradients (a non-finite loss gives them) and
            # lowers its scale, all on the device.
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            # What GradScaler hands a fused optimizer: skip the update where found_inf is 1.
            optimizer: Any = self.optimizer
            optimizer.found_inf, optimizer.grad_scale = nonfinite.float(), None
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf, optimizer.grad_scale
        self.optimizer.zero_grad(set_to_none=True)
        if before_read is not None:
            before_read()
        # The one read of the step: its numbers, once its work is queued.
        *values, norm = torch.cat([sums.flatten(), grad_norm.reshape(1).float()]).tolist()
        loss_sum, nll_sum = sum(values[0::2]), sum(values[1::2])
        result = StepResult(loss_sum, nll_sum, global_tokens, norm, stop_requested, False)
        result.time_up = self._time_spent(seconds)
        if not math.isfinite(loss_sum):
            result.grad_norm = math.nan
        return result

    def _backward(
        self, micro_batches: list[tuple[torch.Tensor, ...]], global_tokens: float
    ) -> torch.Tensor:
        """Forward and backward passes of the micro-batches.

        Returns their (loss, nll) sums on the device, one row per micro-batch."""
        train_cfg = self.cfg.train
        sums = []
        for i, batch in enumerate(micro_batches):
            src, trg_in, trg_out = (x.to(self.device, non_blocking=True) for x in batch)
            last = i == len(micro_batches) - 1
            # Gradients are all-reduced once per step, on its last micro-batch.
            train_model = self.train_model  # a DDP module where the run is distributed
            sync = (
                train_model.no_sync()
                if not last and isinstance(train_model, DDP)
                else nullcontext()
            )
            gradients = distributed.lockstep("the all-reduce of the gradients", self.info)
            with sync, gradients:
                with autocast(self.device, self.autocast_dtype):
                    # (B, T, D); targets are right-padded: causal self-attention needs no mask
                    hidden = train_model(src, trg_in, features_only=True, right_padded=True)
                # The output projection runs inside the loss, in blocks (no (B, T, V) logits).
                loss, nll = linear_label_smoothed_nll(
                    hidden,
                    self.model.out.weight,
                    trg_out,
                    PAD_ID,
                    train_cfg.label_smoothing,
                    self.autocast_dtype,
                    bias=self.model.out.bias,
                    vocab_multiple=self.vocab_multiple,
                )
                # DDP averages gradients over ranks; the world size turns that mean back into a
                # sum, so the step's gradient is (sum of token losses) / (global token count).
                self.scaler.scale(loss * (self.info.world_size / global_tokens)).backward()
            sums.append(torch.stack([loss.detach().float(), nll.float()]))
        return torch.stack(sums)

    def _step_after_reading(
        self,
        sums: torch.Tensor,
        global_tokens: float,
        stop_requested: bool,
        seconds: float,
        before_read: Callable[[], None] | None,
    ) -> StepResult:
        """The rest of a step where the loss is read before the update.

        Several processes (whose sums and stop flags are all-reduced), or an optimizer without
        ``found_inf``."""
        if before_read is not None:
            before_read()
        pairs = sums.tolist()
        # The stop flag rides along with the sums: one collective, and all ranks stop together.
        # Rank 0's clock decides the time budget (and the linear schedule's lr), so that no two
        # ranks disagree about it.
        loss_sum, nll_sum, stops, seconds = distributed.all_reduce_sum(
            [
                sum(x for x, _ in pairs),
                sum(x for _, x in pairs),
                float(stop_requested),
                seconds if self.info.is_main else 0.0,
            ],
            self.info,
            self.device,
        )
        time_up = self._time_spent(seconds)
        result = StepResult(loss_sum, nll_sum, global_tokens, math.nan, stops > 0, time_up)
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():  # let the scaler lower its scale, as for an inf grad
                self.scaler.update(self.scaler.get_scale() / 2)
            return result
        self.scaler.unscale_(self.optimizer)  # fp16: the norm and the clipping see true gradients
        result.grad_norm = float(self._clip_gradients())
        self._set_lr(self.state.step + 1, seconds)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _clip_gradients(self) -> torch.Tensor:
        """The global gradient norm, a tensor (not read here).

        The gradients are clipped to ``train.clip_norm`` where set; without clipping the norm is
        only measured (logged: a rising norm warns of a blow-up before the loss does)."""
        clip = self.cfg.train.clip_norm
        if clip > 0 or not hasattr(torch.nn.utils, "get_total_norm"):
            return torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), clip if clip > 0 else math.inf
            )
        # The norm alone: clip_grad_norm_ would also multiply every gradient by 1.
        return torch.nn.utils.get_total_norm(
            [p.grad for p in self.model.parameters() if p.grad is not None]
        )

    def _set_lr(self, step: int, seconds: float) -> None:
        lr = self._lr(step, seconds)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _lr(self, step: int, seconds: float) -> float:
        """The learning rate of optimizer step ``step``, ``seconds`` of training time spent."""
        train_cfg, d_model = self.cfg.train, self.cfg.model.d_model
        if train_cfg.lr_schedule == "noam":
            return noam_lr(step, d_model, train_cfg.warmup_steps, train_cfg.lr_factor)
        if step > train_cfg.warmup_steps and self.state.warmup_seconds is None:
            self.state.warmup_seconds = seconds  # the time budget of the decay starts here
        left = budget_left(
            step,
            train_cfg.max_steps,
            train_cfg.warmup_steps,
            seconds,
            train_cfg.max_minutes * 60.0,
            self.state.warmup_seconds,
        )
        return linear_decay_lr(step, d_model, train_cfg.warmup_steps, train_cfg.lr_factor, left)

    # ----------------------------------------------------------------------------- decisions
    def _log_due(self, step: StepResult) -> bool:
        """Whether a metrics line is due: every ``log_every`` steps and at the last step.

        The last step (max_steps, the time budget or a signal ends it; early stopping is known only
        after validation)."""
        return (
            self.state.step % self.cfg.train.log_every == 0
            or self._at_max_steps()
            or step.time_up
            or step.stop
        )

    def _validation_due(self, step: StepResult) -> bool:
        """Whether to validate (and checkpoint) now.

        Every ``valid_every`` steps, at the last step, and when the time budget is spent.
        """
        return (
            self.state.step % self.cfg.train.valid_every == 0
            or self._at_max_steps()
            or step.time_up
        )

    def _at_max_steps(self) -> bool:
        return self.state.step >= self.cfg.train.max_steps

    def _time_spent(self, seconds: float) -> bool:
        """Whether ``seconds`` of training use up train.max_minutes (0: no budget)."""
        budget_s = self.cfg.train.max_minutes * 60.0
        return budget_s > 0 and seconds >= budget_s

    def _patience_spent(self) -> bool:
        """Whether train.patience validations in a row brought no improvement (0: never)."""
        patience = self.cfg.train.patience
        return patience > 0 and self.state.bad_validations >= patience

    def _stop_reason(self, step: StepResult, early_stop: bool) -> StopReason | None:
        """Why to stop after this step, if at all (in this order of precedence)."""
        if early_stop:
            return StopReason.EARLY_STOP
        if step.time_up:
            return StopReason.TIME_UP
        if self._at_max_steps():  # a signal during the last step: the run is complete anyway
            return StopReason.MAX_STEPS
        if step.stop:
            return StopReason.SIGNAL
        return None

    # ---------------------------------------------------------------------------------- loop
    def validate(self) -> dict[str, float]:
        """Validation loss, perplexity and (with train.valid_bleu) greedy BLEU; see validation.

        Eagerly: compiled layers would compile a graph for each of a search's shapes."""
        with eager(self.compile_counter is not None):
            return validate(
                self.model, self.data, self.cfg, self.info, self.device, self.autocast_dtype
            )

    def run(self) -> TrainState:
        """Train until ``train.max_steps``, the time budget, early stopping, or a stop signal.

        After a signal, ``stop_signal`` names it; returns the state. Releases the run directory."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> TrainState:
        train_cfg, state = self.cfg.train, self.state
        if not self._begin():
            return state
        batches, prepare = self._batches()
        bar = self._progress_bar()
        accum = train_cfg.accum_steps
        started, spent_before = time.perf_counter(), state.train_seconds

        def elapsed() -> float:
            """Training seconds of the whole run, earlier invocations included."""
            return spent_before + time.perf_counter() - started

        window = MetricsWindow(started)
        with StopFlag() as stop_flag:
            while True:
                state.train_seconds = elapsed()
                taken = [batches.take() for _ in range(accum)]
                state.epoch, state.batch_in_epoch = batches.position
                step = self.train_step(
                    [batch for batch, _ in taken],
                    stop_flag.requested,
                    state.train_seconds,
                    tokens=[n for _, n in taken],
                    before_read=prepare,
                )
                if not math.isfinite(step.loss):  # all-reduced: every rank skips or stops alike
                    self._skip_nonfinite()
                    if step.stop:
                        reason, saved = StopReason.SIGNAL, False
                        if window.tokens:  # the steps since the last metrics line
                            window = self._log_step(window, bar)
                        break
                    continue
                state.nonfinite_in_a_row = 0
                state.step += 1
                bar.update(1)
                window.add(step.loss, step.nll, step.tokens, step.grad_norm)
                if self._log_due(step):
                    window = self._log_step(window, bar)
                early_stop = saved = self._validation_due(step)
                if saved:
                    valid_started = time.perf_counter()
                    early_stop = self._validate_and_save(elapsed)
                    # Validation time is not training time: the current log window (which may
                    # hold steps from before the validation) leaves it out.
                    window.pause(time.perf_counter() - valid_started)
                stopping = self._stop_reason(step, early_stop)
                if stopping is not None:
                    reason = stopping
                    if window.tokens:  # early stopping, at a step not logged yet
                        window = self._log_step(window, bar)
                    break
        if reason is StopReason.SIGNAL:
            # A rank stopped because another one was signalled reports SIGTERM.
            self.stop_signal = stop_flag.signum or signal.SIGTERM
        bar.close()
        self._finish(reason, saved)
        return state

    def _batches(self) -> tuple[DeviceBatches, Callable[[], None] | None]:
        """This rank's batches on the device, and what readies the next ones during a step.

        On a GPU the next step's batches are collated and copied while a step computes (None on
        a CPU, where that would only move the same work). The epoch's shapes and padding are
        logged."""
        stream = self._stream()
        if self.info.is_main:
            log.info(stream.describe())
        batches = DeviceBatches(stream, self.device)
        accum = self.cfg.train.accum_steps
        prepare = None if self.device.type == "cpu" else lambda: batches.prepare(accum)
        return batches, prepare

    def _stream(self) -> BatchStream:
        """This rank's batches from where the state says the run is."""
        return BatchStream(
            self.data.train,
            self.cfg,
            self.info,
            self.data.sampler,
            epoch=self.state.epoch,
            batch_in_epoch=self.state.batch_in_epoch,
            multiple=self.shape_multiple,
        )

    def _progress_bar(self) -> tqdm:
        """The steps' progress bar (the main rank's, when progress is on)."""
        return tqdm(
            total=self.cfg.train.max_steps,
            initial=self.state.step,
            disable=not (self.progress and self.info.is_main),
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )

    def _begin(self) -> bool:
        """Write the run's setup files and say what is about to happen.

        False when the run has already ended (max_steps, early stopping or max_minutes: nothing to
        do)."""
        train_cfg, state = self.cfg.train, self.state
        average = self.run_dir.path / "average.pt"
        ended = self._ended()

        def setup() -> None:
            if not ended:  # an ended run's config.yaml stays the config it trained with
                self.run_dir.write_setup(self.cfg, self.data.src_tok, self.data.trg_tok, state.step)
            if state.history and state.history[-1]["step"] == state.step:
                self.run_dir.restore_step_file(state.step)  # before an average is made of them

        distributed.main_first(setup, self.info, lambda: None)
        if ended:
            log.info(f"{self.run_dir.path} {ended}")
            if train_cfg.average_last > 0 and not average.is_file():
                self._write_average()  # the run ended before it could (a crash at the end)
            return False
        if state.step > 0 and self.info.is_main and average.is_file():
            average.unlink()  # an earlier end's: the run goes on, and its end writes a new one
            log.info(f"removed {average}: it averaged the run as it was at an earlier end")
        self.run_dir.metrics.open(state.step)
        log.info(
            f"training on {self.device} ({self.info.world_size} process(es)): "
            f"{sum(p.numel() for p in self.model.parameters()):,} parameters, "
            f"{_pairs(self.data)}, steps {state.step} -> {train_cfg.max_steps}, "
            f"precision {self.precision} ({self.precision_why})"
        )
        self.model.train()
        return True

    def _ended(self) -> str:
        """Why a resumed run has nothing left to do ("" when it goes on).

        Each way it can end, checked against the config of this invocation (raise the limit to go
        on)."""
        train_cfg, state = self.cfg.train, self.state
        if self._at_max_steps():
            return f"has already reached train.max_steps={train_cfg.max_steps}"
        if self._patience_spent():
            return (
                f"stopped early ({state.bad_validations} validations without improvement, "
                f"train.patience={train_cfg.patience}); raise train.patience to train on"
            )
        if self._time_spent(state.train_seconds):
            return f"has spent train.max_minutes={train_cfg.max_minutes:g}; raise it to train on"
        return ""

    def _skip_nonfinite(self) -> None:
        """Count a step whose loss was not finite (its update was skipped).

        Too many in a row stop the run with what to do about it."""
        state = self.state
        state.nonfinite_in_a_row += 1
        if self.info.is_main:
            warnings.warn(f"step {state.step + 1}: non-finite loss, step skipped", stacklevel=2)
        if state.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            raise MTError(
                f"loss was not finite for {state.nonfinite_in_a_row} steps in a row at step "
                f"{state.step + 1}; lower train.lr_factor, set train.clip_norm, or use "
                "train.precision=bf16 or fp32"
            )

    def _log_step(self, window: MetricsWindow, bar: tqdm) -> MetricsWindow:
        """Write the window's metrics line; returns the next window."""
        now = time.perf_counter()
        summary = window.summary(now)
        lr = self.optimizer.param_groups[0]["lr"]
        record = {
            "step": self.state.step,
            "time_s": round(self.state.train_seconds, 1),
            "epoch": self.state.epoch,
            "loss": summary["loss"],
            "nll": summary["nll"],
            "lr": lr,
            "grad_norm": summary["grad_norm"],
            "tokens_per_s": summary["tokens_per_s"],
        }
        self.run_dir.metrics.write(record)
        bar.set_postfix(
            loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{summary['tokens_per_s']:,.0f}"
        )
        return MetricsWindow(now)

    def _validate_and_save(self, elapsed: Callable[[], float]) -> bool:
        """Validate, log, checkpoint (best.pt when improved); returns whether to stop early.

        ``elapsed()`` reads the run's training clock, which the checkpoint records."""
        state, train_cfg = self.state, self.cfg.train
        result = self.validate()
        value = result["val_bleu"] if train_cfg.best_metric == "bleu" else result["val_loss"]
        better = state.best is None or (
            value > state.best if train_cfg.best_metric == "bleu" else value < state.best
        )
        state.best_metric = train_cfg.best_metric
        if better:
            state.best, state.bad_validations = value, 0
        else:
            state.bad_validations += 1
        state.history.append({"step": state.step, **result})
        state.train_seconds = elapsed()
        self.run_dir.metrics.write(
            {
                "step": state.step,
                "time_s": round(state.train_seconds, 1),
                **result,
                **self._memory_mib(),
                **(self.compile_counter.record() if self.compile_counter else {}),
                "precision": self.precision,  # what the numbers were computed in
            }
        )
        log.info(f"step {state.step}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
        self._save(best=better)
        if self.kept_freed_memory:
            release_freed_memory()  # the pages validation's odd shapes left behind
        return self._patience_spent()

    def _memory_mib(self) -> dict[str, float]:
        """Memory for the validation record (rank 0 logs it).

        The peak GPU memory torch allocated (``cuda_peak_mib``), or on a CPU the resident size
        before freed pages go back (``rss_mib``)."""
        if self.device.type == "cuda":
            return {"cuda_peak_mib": round(torch.cuda.max_memory_allocated(self.device) / 2**20)}
        rss = resident_mib() if self.device.type == "cpu" else None
        return {} if rss is None else {"rss_mib": round(rss)}

    def _finish(self, reason: StopReason, saved: bool) -> None:
        """The one exit of the loop.

        A run stopped by a signal is saved (unless this step's validation just did) to be resumed,
        so it gets no average; every other ending says why it ended and writes average.pt when asked
        for."""
        train_cfg, step = self.cfg.train, self.state.step
        if reason is StopReason.SIGNAL:
            if not saved:
                self._save(best=False, step_file=False)
            log.info(f"stopped by signal at step {step}; resume with the same command")
        else:
            if reason is StopReason.EARLY_STOP:
                log.info(f"early stopping: no improvement in {train_cfg.patience} validations")
            elif reason is StopReason.TIME_UP:
                log.info(f"train.max_minutes={train_cfg.max_minutes:g} spent at step {step}")
            if train_cfg.average_last > 0:
                self._write_average()
        self.run_dir.metrics.close()

    def _write_average(self) -> None:
        average = lambda: self.run_dir.write_average(self.cfg.train.average_last)  # noqa: E731
        distributed.main_first(average, self.info, lambda: None)


def train(
    cfg: Config,
    run_dir: Path,
    *,
    resume: bool = True,
    progress: bool = True,
    allow_data_change: bool = False,
) -> TrainState:
    """Prepare data, train, and write the run directory; the library entry of `mt train`.

    Raises:
        StoppedBySignal: Ctrl-C or SIGTERM stopped the run (after saving its checkpoint).
        MTError: a user's mistake, another process training in ``run_dir``, a resume on changed
            data (without ``allow_data_change``), a rank that stopped answering.
    """
    try:
        trainer = Trainer(
            cfg, run_dir, resume=resume, progress=progress, allow_data_change=allow_data_change
        )
        state = trainer.run()
        if trainer.stop_signal is not None:
            raise StoppedBySignal(trainer.stop_signal, state.step)
        return state
    finally:
        # Also when the constructor failed after joining the process group: a group left alive at
        # exit aborts the process (SIGABRT) instead of exiting with the error's code.
        distributed.shutdown()


def _pairs(data: PreparedData) -> str:
    """The training pairs, for the log: ``19,810 pairs``, or a mix's sources and epoch size."""
    train = data.train
    return train.describe() if isinstance(train, MixedCorpus) else f"{len(train):,} pairs"
