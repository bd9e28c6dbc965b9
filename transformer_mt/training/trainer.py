"""The training loop: one flat loop from prepared data to checkpoints and metrics.

One optimizer step = ``accum_steps`` micro-batches on each rank. The loss of a step is the sum of
the label-smoothed token losses divided by the *global* number of non-pad target tokens of that
step (all micro-batches, all ranks), so 1 process with batch B equals N processes with B/N each.
The Noam learning rate is set once per optimizer step.
"""

import inspect
import json
import math
import random
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from transformer_mt.config import Config, save_config
from transformer_mt.data.batching import make_batches, shard_batches
from transformer_mt.data.prepare import PreparedData, prepare
from transformer_mt.data.tokenizer import BOS_ID, PAD_ID, SPECIAL_IDS, Tokenizer
from transformer_mt.errors import MTError
from transformer_mt.evaluation import corpus_bleu
from transformer_mt.model import Transformer
from transformer_mt.training import distributed as D
from transformer_mt.training.batches import BatchStream, collate
from transformer_mt.training.checkpoint import average_checkpoints, load_checkpoint, save_atomic
from transformer_mt.training.host_memory import (
    bound_kernel_caches,
    keep_freed_memory,
    release_freed_memory,
    resident_mib,
)
from transformer_mt.training.loss import label_smoothed_nll, linear_label_smoothed_nll
from transformer_mt.training.schedule import budget_left, linear_decay_lr, noam_lr
from transformer_mt.training.state import (
    StopFlag,
    TrainState,
    rank_seed,
    rng_state,
    set_rng_state,
)


def model_args(cfg: Config, src_tok: Tokenizer, trg_tok: Tokenizer) -> dict[str, Any]:
    """The Transformer's keyword arguments; stored in checkpoints to rebuild the model."""
    m = cfg.model
    vocab = max(src_tok.vocab_size, trg_tok.vocab_size) if m.share_embeddings else None
    return dict(
        src_pad_idx=PAD_ID,
        trg_pad_idx=PAD_ID,
        trg_sos_idx=BOS_ID,
        enc_voc_size=vocab or src_tok.vocab_size,
        dec_voc_size=vocab or trg_tok.vocab_size,
        d_model=m.d_model,
        n_head=m.n_head,
        max_len=m.max_len,
        ffn_hidden=m.ffn_hidden,
        n_layers=m.n_layers,
        drop_prob=m.drop_prob,
        n_dec_layers=m.n_dec_layers,
        pre_norm=m.pre_norm,
        attn_drop_prob=m.attn_drop_prob,
        ffn_drop_prob=m.ffn_drop_prob,
        tie_embeddings=m.tie_embeddings,
        share_embeddings=m.share_embeddings,
    )


@dataclass
class StepResult:
    """One optimizer step, summed over micro-batches and ranks (identical on every rank)."""

    loss: float  # summed label-smoothed loss
    nll: float  # summed negative log-likelihood
    tokens: float  # non-pad target tokens
    grad_norm: float  # global gradient norm before clipping; nan for a skipped step
    stop: bool  # some rank was asked to stop (Ctrl-C, SIGTERM)
    time_up: bool  # rank 0 found train.max_minutes spent


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MTError(f"train.device={name!r} but no CUDA GPU is visible; use cpu or auto")
    return torch.device(name)


def _check_autocast(device: torch.device, dtype: torch.dtype | None, precision: str) -> None:
    """Fail before any work if autocast cannot run ``dtype`` on ``device``.

    torch does not raise for an unsupported autocast dtype: it warns and runs in fp32, which would
    silently train at another precision than the config says.
    """
    if dtype is None:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device.type, dtype=dtype):
            enabled = torch.is_autocast_enabled(device.type)
    if not enabled or any("not supported" in str(w.message) for w in caught):
        instead = "bf16 or fp32" if precision == "fp16" else "fp32"
        raise MTError(
            f"train.precision={precision} is not supported on {device.type} by this torch "
            f"({torch.__version__}); use train.precision={instead}"
        )


class Trainer:
    """Holds the model, optimizer and state of one run; ``run()`` trains to ``max_steps``."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        *,
        resume: bool = True,
        progress: bool = True,
        say=print,
        data: PreparedData | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        t = cfg.train
        self.device = resolve_device(t.device)
        self.info = D.init_distributed(self.device.type)
        if self.device.type == "cuda" and self.info.enabled:
            self.device = torch.device("cuda", self.info.local_rank)
            torch.cuda.set_device(self.device)
        self.say = say if self.info.is_main else (lambda *a, **k: None)
        if t.threads > 0:
            torch.set_num_threads(t.threads)
        on_cpu = self.device.type == "cpu"
        if on_cpu:
            bound_kernel_caches()  # before the first bf16 product builds a oneDNN kernel
        # True where glibc keeps freed memory: then validations hand their leftovers back.
        self.kept_freed_memory = on_cpu and t.keep_freed_memory and keep_freed_memory()
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
        _check_autocast(self.device, self.autocast_dtype, t.precision)
        if data is None:
            # Rank 0 prepares (downloads, trains sentencepiece, binarizes); the others then read
            # the finished caches, so no two processes build the same files. If rank 0 fails
            # (a missing file, a bad download), every rank stops with its message.
            data = D.main_first(
                lambda: prepare(cfg, self.say, progress),
                self.info,
                lambda: prepare(cfg, lambda *a, **k: None, False),
            )
        self.data = data
        torch.manual_seed(t.seed)  # the same initial weights on every rank
        random.seed(t.seed)
        self.model_args = model_args(cfg, data.src_tok, data.trg_tok)
        self.model = Transformer(**self.model_args).to(self.device)
        torch.manual_seed(rank_seed(t.seed, self.info.rank))
        random.seed(rank_seed(t.seed, self.info.rank))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=0.0,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=t.precision == "fp16")
        self.state = TrainState()
        self.tb: Any = None  # TensorBoard writer, opened by run() when train.tensorboard is on
        self.last_path = self.run_dir / "last.pt"
        if resume and self.last_path.is_file():
            self._restore(self.last_path)
        self.train_model: torch.nn.Module = self.model
        if t.compile:
            self.train_model = torch.compile(self.model)
        if self.info.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            # The only buffer is the constant sinusoid table: broadcasting it before every forward
            # pass would cost a collective per micro-batch for nothing. (torch 2.13 renamed the
            # switch; older versions know only broadcast_buffers.)
            no_sync = (
                {"forward_sync_buffers": False}
                if "forward_sync_buffers" in inspect.signature(DDP).parameters
                else {"broadcast_buffers": False}
            )
            self.train_model = DDP(self.train_model, device_ids=ids, **no_sync)

    # ----------------------------------------------------------------------------- checkpoints
    def _checkpoint(self, rng_per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        return {
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
            },
        }

    def _restore(self, path: Path) -> None:
        ckpt = load_checkpoint(path, map_location=self.device)
        if ckpt["model_args"] != self.model_args:
            raise MTError(
                f"{path} was trained with another model shape or vocabulary; use a new --run-dir "
                "or the run's own config"
            )
        self.model.load_state_dict(ckpt["model"])
        ts = ckpt["train_state"]
        self.optimizer.load_state_dict(ts["optimizer"])
        self.scaler.load_state_dict(ts["scaler"])
        self.state = TrainState(**ts["state"])
        per_rank = ts.get("rng_per_rank", [ts["rng"]])
        if len(per_rank) == self.info.world_size:
            set_rng_state(per_rank[self.info.rank], self.device)
        else:  # another world size: batches differ anyway, so fresh per-rank streams are fine
            self.say(f"resuming with {self.info.world_size} process(es) instead of {len(per_rank)}")
            set_rng_state(per_rank[0], self.device)
            if self.info.rank:
                torch.manual_seed(rank_seed(self.cfg.train.seed + self.state.step, self.info.rank))
        self.say(f"resuming {path} at step {self.state.step} (epoch {self.state.epoch})")

    def _save(self, best: bool) -> None:
        """Write last.pt, step_N.pt (and best.pt); a collective: every rank calls it, rank 0 writes.

        A failed write (disk full) stops every rank with rank 0's message instead of leaving the
        others to wait in the next collective.
        """
        rngs = D.all_gather_objects(rng_state(self.device), self.info)
        D.main_first(lambda: self._write_checkpoints(rngs, best), self.info, lambda: None)

    def _write_checkpoints(self, rngs: list[dict[str, Any]], best: bool) -> None:
        ckpt = self._checkpoint(rngs)
        step_path = self.run_dir / f"step_{self.state.step}.pt"
        save_atomic(ckpt, step_path)
        save_atomic(ckpt, self.last_path)
        if best:
            save_atomic(ckpt, self.run_dir / "best.pt")
        step_files = sorted(self.run_dir.glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
        for old in step_files[: max(0, len(step_files) - self.cfg.train.keep_last)]:
            old.unlink()

    def _write_average(self) -> None:
        """average.pt: the weights averaged over the last ``train.average_last`` step checkpoints
        (rank 0 only). Averaging the last few checkpoints of a run usually adds BLEU for free."""
        steps = sorted(self.run_dir.glob("step_*.pt"), key=lambda p: int(p.stem[5:]))
        chosen = steps[-self.cfg.train.average_last :]
        average_checkpoints(chosen, self.run_dir / "average.pt")
        names = ", ".join(p.name for p in chosen)
        self.say(f"wrote {self.run_dir / 'average.pt'}: the average of {names}")

    def _write_run_files(self) -> None:
        """The run directory's config and tokenizers (rank 0 only; see ``main_first``)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.cfg, self.run_dir / "config.yaml")
        for name, tok in (("src", self.data.src_tok), ("trg", self.data.trg_tok)):
            tok.save(self.run_dir / f"spm.{name}.model")
        self._trim_metrics()

    # ------------------------------------------------------------------------------ metrics
    def _log(self, record: dict[str, Any]) -> None:
        if self.info.is_main:
            with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if self.tb is not None:
                for key, value in record.items():
                    if key != "step" and isinstance(value, int | float):
                        self.tb.add_scalar(key, value, record["step"])
                self.tb.flush()

    def _memory_mib(self) -> dict[str, float]:
        """Memory for the validation record (rank 0 logs it): the peak GPU memory torch allocated
        (``cuda_peak_mib``), or on a CPU the resident size before freed pages go back
        (``rss_mib``)."""
        if self.device.type == "cuda":
            return {"cuda_peak_mib": round(torch.cuda.max_memory_allocated(self.device) / 2**20)}
        rss = resident_mib() if self.device.type == "cpu" else None
        return {} if rss is None else {"rss_mib": round(rss)}

    def _open_tensorboard(self) -> Any:
        """A SummaryWriter in RUN_DIR/tensorboard when train.tensorboard is on (rank 0 only)."""
        if not (self.cfg.train.tensorboard and self.info.is_main):
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise MTError(
                "train.tensorboard: true needs the tensorboard package; pip install tensorboard "
                "or set train.tensorboard=false"
            ) from err
        return SummaryWriter(str(self.run_dir / "tensorboard"))

    def _trim_metrics(self) -> None:
        """On resume, drop the lines logged after the checkpoint: they will be logged again."""
        path = self.run_dir / "metrics.jsonl"
        if not (self.info.is_main and path.is_file()):
            return
        keep = [
            ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= self.state.step
        ]
        path.write_text("".join(ln + "\n" for ln in keep))

    # ---------------------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation loss and perplexity on the binarized split; BLEU from greedy decoding.

        Every rank scores and decodes its share, and every rank computes the same result from the
        gathered sums and hypotheses, so all of them take the same early-stopping decision.
        """
        from transformer_mt.translation import translate_lines  # decoding sits above training data

        self.model.eval()
        nll_sum = tokens = 0.0
        batches = make_batches(
            self.data.valid.src_lengths,
            self.data.valid.trg_lengths + 1,
            self.cfg.train.batch_tokens,
            seed=0,
            epoch=0,
            shuffle=False,
        )
        for index in shard_batches(batches, self.info.rank, self.info.world_size):
            src, trg_in, trg_out = (x.to(self.device) for x in collate(self.data.valid, index))
            with self._autocast():
                logits = self.model(src, trg_in)
            _, nll = label_smoothed_nll(logits, trg_out, PAD_ID, 0.0)
            nll_sum += nll.item()
            tokens += (trg_out != PAD_ID).sum().item()
        nll_sum, tokens = D.all_reduce_sum([nll_sum, tokens], self.info, self.device)
        result = {"val_loss": nll_sum / tokens, "val_ppl": math.exp(min(nll_sum / tokens, 50.0))}
        if self.cfg.train.valid_bleu:
            d = self.cfg.decode
            rank, world = self.info.rank, self.info.world_size
            # Rank r decodes lines r, r + world, ...: shares of similar length and cost.
            hyps = translate_lines(
                self.model,
                self.data.src_tok,
                self.data.trg_tok,
                self.data.valid_src[rank::world],
                beam=1,
                max_len_a=d.max_len_a,
                max_len_b=d.max_len_b,
                batch_tokens=d.batch_tokens,
                max_src_len=self.cfg.model.max_len,
                device=self.device,
                progress=False,
            )
            shares = D.all_gather_objects([h[0][0] for h in hyps], self.info)
            ordered = [""] * len(self.data.valid_src)
            for r, share in enumerate(shares):
                ordered[r::world] = share
            result["val_bleu"] = corpus_bleu(ordered, self.data.valid_trg)
        self.model.train()
        return result

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _after_validation(self, result: dict[str, float]) -> tuple[bool, bool]:
        """Update the best value and patience; return (is_best, stop_early)."""
        s, t = self.state, self.cfg.train
        value = result["val_bleu"] if t.best_metric == "bleu" else result["val_loss"]
        better = s.best is None or (value > s.best if t.best_metric == "bleu" else value < s.best)
        if better:
            s.best, s.bad_validations = value, 0
        else:
            s.bad_validations += 1
        s.history.append({"step": s.step, **result})
        return better, t.patience > 0 and s.bad_validations >= t.patience

    # ---------------------------------------------------------------------------------- loop
    def _train_step(
        self, tensors: list[tuple[torch.Tensor, ...]], stop_requested: bool, seconds: float
    ) -> StepResult:
        """One optimizer step on this rank's micro-batches ``tensors`` (src, trg_in, trg_out),
        ``seconds`` of training time spent before it; the result is the same on every rank (sums
        over all ranks), and so is every decision taken from it."""
        t = self.cfg.train
        local_tokens = float(sum((out != PAD_ID).sum().item() for _, _, out in tensors))
        (global_tokens,) = D.all_reduce_sum([local_tokens], self.info, self.device)
        loss_sum = nll_sum = 0.0
        for i, (src, trg_in, trg_out) in enumerate(tensors):
            src, trg_in, trg_out = (
                src.to(self.device),
                trg_in.to(self.device),
                trg_out.to(self.device),
            )
            last = i == len(tensors) - 1
            sync = nullcontext() if last or not self.info.enabled else self.train_model.no_sync()
            with sync:
                with self._autocast():
                    hidden = self.train_model(src, trg_in, features_only=True)  # (B, T, D)
                # The output projection runs inside the loss, in blocks (no (B, T, V) logits).
                loss, nll = linear_label_smoothed_nll(
                    hidden, self.model.out.weight, trg_out, PAD_ID, t.label_smoothing,
                    self.autocast_dtype,
                )  # fmt: skip
                # DDP averages gradients over ranks; the world size turns that mean back into a
                # sum, so the step's gradient is (sum of token losses) / (global token count).
                self.scaler.scale(loss * (self.info.world_size / global_tokens)).backward()
            loss_sum += loss.item()
            nll_sum += nll.item()
        # The stop flag rides along with the sums: one collective, and all ranks stop together.
        # Rank 0's clock decides the time budget (and the linear schedule's lr), so that no two
        # ranks disagree about it.
        loss_sum, nll_sum, stops, seconds = D.all_reduce_sum(
            [loss_sum, nll_sum, float(stop_requested), seconds if self.info.is_main else 0.0],
            self.info,
            self.device,
        )
        budget_s = t.max_minutes * 60.0
        time_up = budget_s > 0 and seconds >= budget_s
        result = StepResult(loss_sum, nll_sum, global_tokens, math.nan, stops > 0, time_up)
        if not math.isfinite(loss_sum):
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler.is_enabled():  # let the scaler lower its scale, as for an inf grad
                self.scaler.update(self.scaler.get_scale() / 2)
            return result
        self.scaler.unscale_(self.optimizer)  # fp16: the norm and the clipping see true gradients
        # Without clipping, max_norm=inf only measures the norm (logged: a rising norm warns of a
        # blow-up before the loss does).
        max_norm = t.clip_norm if t.clip_norm > 0 else math.inf
        result.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        lr = self._lr(self.state.step + 1, seconds)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _lr(self, step: int, seconds: float) -> float:
        """The learning rate of optimizer step ``step``, ``seconds`` of training time spent."""
        t, s, d_model = self.cfg.train, self.state, self.cfg.model.d_model
        if t.lr_schedule == "noam":
            return noam_lr(step, d_model, t.warmup_steps, t.lr_factor)
        if step > t.warmup_steps and s.warmup_seconds is None:
            s.warmup_seconds = seconds  # the time budget of the decay starts here
        left = budget_left(
            step, t.max_steps, t.warmup_steps, seconds, t.max_minutes * 60.0, s.warmup_seconds
        )
        return linear_decay_lr(step, d_model, t.warmup_steps, t.lr_factor, left)

    def run(self) -> TrainState:
        """Train until ``train.max_steps``, early stopping, or a stop signal; returns the state."""
        t, s = self.cfg.train, self.state
        D.main_first(self._write_run_files, self.info, lambda: None)
        self.tb = self._open_tensorboard()
        if s.step >= t.max_steps:
            self.say(f"{self.run_dir} has already reached train.max_steps={t.max_steps}")
            return s
        self.say(
            f"training on {self.device} ({self.info.world_size} process(es)): "
            f"{sum(p.numel() for p in self.model.parameters()):,} parameters, "
            f"{len(self.data.train):,} pairs, steps {s.step} -> {t.max_steps}"
        )
        stream = iter(BatchStream(self.data.train, self.cfg, self.info, s, self.data.sampler))
        self.model.train()
        bar = tqdm(
            total=t.max_steps,
            initial=s.step,
            disable=not (self.progress and self.info.is_main),
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        window = _new_window()
        started, spent_before = time.perf_counter(), s.train_seconds
        interrupted = False  # by a signal: no final average, the run is to be resumed
        with StopFlag() as stop:
            while s.step < t.max_steps:
                s.train_seconds = spent_before + time.perf_counter() - started
                step = self._train_step(
                    [next(stream) for _ in range(t.accum_steps)], stop.requested, s.train_seconds
                )
                if not math.isfinite(step.loss):  # all-reduced: every rank skips or stops alike
                    s.nonfinite_in_a_row += 1
                    if self.info.is_main:
                        msg = f"step {s.step + 1}: non-finite loss, step skipped"
                        warnings.warn(msg, stacklevel=1)
                    if s.nonfinite_in_a_row >= t.max_nonfinite:
                        raise MTError(
                            f"loss was not finite for {s.nonfinite_in_a_row} steps in a row at step "
                            f"{s.step + 1}; lower train.lr_factor, set train.clip_norm, or use "
                            "train.precision=bf16 or fp32"
                        )
                    if step.stop:
                        self._save(best=False)
                        self.say(
                            f"stopped by signal at step {s.step}; resume with the same command"
                        )
                        interrupted = True
                        break
                    continue
                s.nonfinite_in_a_row = 0
                s.step += 1
                bar.update(1)
                window["loss"] += step.loss
                window["nll"] += step.nll
                window["tokens"] += step.tokens
                if math.isfinite(step.grad_norm):  # fp16 overflow: the scaler skipped the update
                    window["grad_norm"] += step.grad_norm
                    window["norm_steps"] += 1
                if s.step % t.log_every == 0 or s.step == t.max_steps:
                    now = time.perf_counter()
                    rate = window["tokens"] / max(now - window["time"], 1e-9)
                    lr = self.optimizer.param_groups[0]["lr"]
                    record = {
                        "step": s.step,
                        "time_s": round(s.train_seconds, 1),
                        "epoch": s.epoch,
                        "loss": window["loss"] / window["tokens"],
                        "nll": window["nll"] / window["tokens"],
                        "lr": lr,
                        "grad_norm": window["grad_norm"] / max(window["norm_steps"], 1),
                        "tokens_per_s": rate,
                    }
                    self._log(record)
                    bar.set_postfix(
                        loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}"
                    )
                    window = _new_window()
                if s.step % t.valid_every == 0 or s.step == t.max_steps or step.time_up:
                    valid_started = time.perf_counter()
                    result = self.validate()
                    best, early = self._after_validation(result)
                    s.train_seconds = spent_before + time.perf_counter() - started
                    memory = self._memory_mib()
                    self._log(
                        {"step": s.step, "time_s": round(s.train_seconds, 1), **result, **memory}
                    )
                    if self.info.is_main:
                        summary = ", ".join(f"{k} {v:.3f}" for k, v in result.items())
                        bar.write(f"step {s.step}: {summary}", file=sys.stderr)
                    self._save(best)
                    if self.kept_freed_memory:
                        release_freed_memory()  # the pages validation's odd shapes left behind
                    # Validation time is not training time: the current log window (which may
                    # hold steps from before the validation) starts that much later.
                    window["time"] += time.perf_counter() - valid_started
                    if early:
                        self.say(f"early stopping: no improvement in {t.patience} validations")
                        break
                    if step.time_up:
                        self.say(f"train.max_minutes={t.max_minutes:g} spent at step {s.step}")
                        break
                elif step.stop:
                    self._save(best=False)
                if step.stop:
                    self.say(f"stopped by signal at step {s.step}; resume with the same command")
                    interrupted = True
                    break
        bar.close()
        if t.average_last > 0 and not interrupted:
            D.main_first(self._write_average, self.info, lambda: None)
        if self.tb is not None:
            self.tb.close()
        return s


def _new_window() -> dict[str, float]:
    """Sums over the steps since the last metrics line."""
    keys = ("loss", "nll", "tokens", "grad_norm", "norm_steps")
    return {**dict.fromkeys(keys, 0.0), "time": time.perf_counter()}


def train(
    cfg: Config, run_dir: Path, *, resume: bool = True, progress: bool = True, say=print
) -> TrainState:
    """Prepare data, train, and write the run directory; the library entry of `mt train`."""
    try:
        return Trainer(cfg, run_dir, resume=resume, progress=progress, say=say).run()
    finally:
        # Also when the constructor failed after joining the process group: a group left alive at
        # exit aborts the process (SIGABRT) instead of exiting with the error's code.
        D.shutdown()
