"""Where and at what precision training runs.

The device, the process's place in the job, the
CPU memory settings, and autocast."""

import statistics
import time
import warnings
from contextlib import AbstractContextManager, nullcontext

import torch

from transformer_mt.config import TrainConfig
from transformer_mt.devices import resolve_device
from transformer_mt.errors import MTError
from transformer_mt.training import distributed
from transformer_mt.training.host_memory import bound_kernel_caches, keep_freed_memory

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def setup_process(train_cfg: TrainConfig) -> tuple[torch.device, distributed.DistInfo, bool]:
    """Join the job (torchrun) and pick this rank's device; set threads and CPU memory reuse.

    Returns the device, this process's place in the job, and whether glibc keeps freed memory
    (then the trainer hands the leftovers of each validation back; see host_memory).
    """
    device = resolve_device(train_cfg.device, "train.device")
    info = distributed.init_distributed(device.type, train_cfg.collective_timeout_s)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if train_cfg.threads > 0:
        torch.set_num_threads(train_cfg.threads)
    on_cpu = device.type == "cpu"
    if on_cpu:
        bound_kernel_caches()  # before the first bf16 product builds a oneDNN kernel
    kept_freed_memory = on_cpu and train_cfg.keep_freed_memory and keep_freed_memory()
    return device, info, kept_freed_memory


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``train.precision``, checked on ``device``.

    The autocast dtype of ``train.precision`` (None for fp32), after checking that autocast
    runs it on ``device``.

    torch does not raise for an unsupported autocast dtype: it warns and runs in fp32, which would
    silently train at another precision than the config says.
    """
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return None
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
    return dtype


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """Mixed precision for the forward pass, or nothing for fp32."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 products natively.

    Whether this CPU computes bf16 products natively (AVX512-BF16 or AMX), as Linux's
    /proc/cpuinfo says; False where it cannot tell. Without them bf16 runs on a slow path (about
    2.5x slower than fp32 on a 2-core Xeon, docs/BENCHMARKS.md)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


BF16_MARGIN = 1.15  # bf16 is chosen only this much faster: a noisy probe must not flip a choice


def probe_bf16_speedup(device: torch.device, d_model: int, ffn_hidden: int, rows: int) -> float:
    """How many times faster a product at the model's shapes runs in bf16 than in fp32.

    How many times faster a product at the model's shapes ((rows, d_model) x (d_model,
    ffn_hidden), forward, as autocast runs it) runs in bf16 than in fp32: the median of 5 ratios,
    each of an fp32 and a bf16 timing taken one after the other (so that a busy machine slows
    both alike), each timing repeating the product for about 2 ms. Some tens of milliseconds."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(rows, d_model, generator=gen).to(device)
    w = torch.randn(ffn_hidden, d_model, generator=gen).to(device)
    reps = max(1, min(50, round(2e-3 / (2 * rows * d_model * ffn_hidden / 5e10))))

    def seconds(dtype: torch.dtype | None) -> float:
        with torch.no_grad(), autocast(device, dtype):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(reps):
                torch.nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - started

    seconds(None), seconds(torch.bfloat16)  # warm-up: kernels chosen, caches filled
    return statistics.median(seconds(None) / seconds(torch.bfloat16) for _ in range(5))


def choose_precision(
    device: torch.device, d_model: int, ffn_hidden: int, rows: int
) -> tuple[str, str]:
    """Choose the precision of ``train.precision: auto``.

    ``train.precision: auto``: bf16 where the device runs it natively and a short probe at
    the model's shapes measures it faster than fp32 (by ``BF16_MARGIN``), else fp32; (the
    choice, why)."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "the GPU runs bf16 natively"
        return "fp32", "the GPU has no native bf16"
    if device.type != "cpu":
        return "fp32", f"autocast to bf16 is not used on {device.type}"
    if not cpu_has_native_bf16():
        return "fp32", "this CPU has no AVX512-BF16 or AMX: bf16 would run on a slow path"
    speedup = probe_bf16_speedup(device, d_model, ffn_hidden, rows)
    probe = f"a probe at the model's shapes ran bf16 {speedup:.2f}x as fast as fp32"
    return ("bf16", probe) if speedup > BF16_MARGIN else ("fp32", probe)
