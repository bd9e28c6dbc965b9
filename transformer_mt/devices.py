"""Device names and precision: where a name from a config or an option becomes a torch device.

The spelling of a device name has one check, :func:`transformer_mt.config.check_device_name`:
config validation runs it before any work and without touching the hardware, and
:func:`resolve_device` runs it too (for an option, which no config validation saw), then checks
that this process can use the device, with a one-line error naming the key or option it came
from. :func:`choose_precision` is ``precision: auto``'s choice, for training and for translating.
"""

import time
from collections.abc import Callable

import torch

from transformer_mt.config import check_device_name
from transformer_mt.errors import MTError


def resolve_device(name: str | torch.device, key: str = "--device") -> torch.device:
    """Resolve a device name to a torch device this process can use.

    ``name`` ("auto", "cpu", "cuda", "cuda:N", "mps"; or a torch device) as a torch device this
    process can use; "auto" is the GPU when one is visible, else the CPU. ``key`` names where it
    came from, in a one-line MTError: for a name misspelled, the one config validation gives
    (:func:`~transformer_mt.config.check_device_name`), else for a device this process lacks."""
    index: int | None
    if isinstance(name, torch.device):
        kind, index = name.type, name.index
    else:
        check_device_name(name, key)
        if name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        kind, _, number = name.partition(":")
        index = int(number) if number else None  # checked before torch reads it (cuda:01)
    cpu = f"{key} cpu" if key.startswith("--") else f"{key}=cpu"  # what to use instead
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise MTError(
                f"{key} {name}: no CUDA GPU is visible to this process (torch.cuda.is_available()"
                f" is false); use {cpu}, or check the driver and CUDA_VISIBLE_DEVICES"
            )
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            raise MTError(f"{key} {name}: only {count} GPU(s) visible (cuda:0 to cuda:{count - 1})")
    elif kind == "mps":
        if not torch.backends.mps.is_available():
            raise MTError(f"{key} {name}: MPS is not available on this machine; use {cpu}")
    elif kind != "cpu":  # a torch device of another type (a name of one is misspelled above)
        raise MTError(f"{key} {name}: expected cpu, cuda, cuda:N or mps")
    return torch.device(kind) if index is None else torch.device(kind, index)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 products natively (AVX512-BF16 or AMX).

    Read from Linux's /proc/cpuinfo; False where it cannot tell. Without them bf16 runs on a slow
    path (about 2.5x slower than fp32 on a 2-core Xeon, docs/BENCHMARKS.md)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cuda_has_native_bf16(device: torch.device) -> bool:
    """Whether this GPU computes bf16 natively.

    Compute capability 8.0 or newer (Ampere and later), or AMD's (ROCm). Not
    ``torch.cuda.is_bf16_supported()``: by default it also answers yes where bf16 is only
    emulated (V100, T4), where it runs slower than fp16 and gains nothing over fp32."""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_properties(device).major >= 8


BF16_MARGIN = 1.15  # bf16 is chosen only this much faster: a noisy probe must not flip a choice
PROBE_TRIALS = 7  # timed (fp32, bf16) pairs of the probe, interleaved
PROBE_MORE_TRIALS = 14  # more pairs when the first ones decide within NEAR_MARGIN of the margin
NEAR_MARGIN = 1.5


def bf16_speedup(fp32_seconds: list[float], bf16_seconds: list[float]) -> float:
    """The speedup of bf16 over fp32 from interleaved timings of the same product.

    It is the ratio of each precision's fastest trial. A busy neighbour only ever adds time to a
    trial; the fastest of several trials, taken in turns with the other precision's, is the one
    it disturbed least, for both precisions alike.
    (A median or a mean of per-pair ratios moves with the neighbour: on a busy 2-core machine
    one probe measured 1.10x where a quiet one measured 2.67x.)"""
    return min(fp32_seconds) / min(bf16_seconds)


def probe_bf16_speedup(
    device: torch.device,
    d_model: int,
    ffn_hidden: int,
    rows: int,
    trials: int = PROBE_TRIALS,
    more_trials: int = PROBE_MORE_TRIALS,
    timer: Callable[[bool], float] | None = None,
) -> float:
    """How many times faster a product at the model's shapes runs in bf16 than in fp32.

    The product is (rows, d_model) x (d_model, ffn_hidden), forward, as autocast runs it; each
    timing repeats it for about 2 ms. ``trials`` fp32 and bf16 timings are taken in turns after
    one untimed pair, and :func:`bf16_speedup` takes the fastest of each; where that lands
    within ``NEAR_MARGIN`` of ``BF16_MARGIN`` either way, ``more_trials`` pairs more are taken
    (the fastest trials can only get faster). Some tens of milliseconds, 0.1 s at most when it
    measures again. ``timer(bf16)`` (tests) replaces the timing: seconds of one trial."""
    if timer is None:
        timer = _product_timer(device, d_model, ffn_hidden, rows)
        timer(False), timer(True)  # warm-up: kernels chosen, caches filled
    fp32: list[float] = []
    bf16: list[float] = []
    for _ in range(trials):
        fp32.append(timer(False))
        bf16.append(timer(True))
    speedup = bf16_speedup(fp32, bf16)
    if BF16_MARGIN / NEAR_MARGIN < speedup < BF16_MARGIN * NEAR_MARGIN:
        for _ in range(more_trials):
            fp32.append(timer(False))
            bf16.append(timer(True))
        speedup = bf16_speedup(fp32, bf16)
    return speedup


def _product_timer(
    device: torch.device, d_model: int, ffn_hidden: int, rows: int
) -> Callable[[bool], float]:
    """A function timing the probe's product once in fp32 (False) or bf16 (True), in seconds."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(rows, d_model, generator=gen).to(device)
    w = torch.randn(ffn_hidden, d_model, generator=gen).to(device)
    reps = max(1, min(50, round(2e-3 / (2 * rows * d_model * ffn_hidden / 5e10))))

    def seconds(bf16: bool) -> float:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(reps):
                torch.nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter() - started

    return seconds


def choose_precision(
    device: torch.device, d_model: int, ffn_hidden: int, rows: int, *, fp16: bool = False
) -> tuple[str, str]:
    """Choose what ``precision: auto`` means here (``train.precision``, ``decode.precision``).

    bf16 where the device runs it natively and a short probe at the model's shapes measures it
    faster than fp32 (by ``BF16_MARGIN``, :func:`probe_bf16_speedup`), else fp32; returns (the
    choice, why). ``fp16`` (training, which has a gradient scaler for it): a GPU without native
    bf16 (V100, T4) trains in fp16 instead of fp32."""
    if device.type == "cuda":
        if cuda_has_native_bf16(device):
            return "bf16", "the GPU runs bf16 natively"
        if fp16:
            return "fp16", "the GPU has no native bf16: fp16 autocast with a gradient scaler"
        return "fp32", "the GPU has no native bf16"
    if device.type != "cpu":
        return "fp32", f"autocast to bf16 is not used on {device.type}"
    if not cpu_has_native_bf16():
        return "fp32", "this CPU has no AVX512-BF16 or AMX: bf16 would run on a slow path"
    speedup = probe_bf16_speedup(device, d_model, ffn_hidden, rows)
    return decide_bf16(speedup)


def decide_bf16(speedup: float) -> tuple[str, str]:
    """bf16 or fp32 on a CPU with native bf16, from the probe's speedup; (the choice, why)."""
    probe = f"a probe at the model's shapes ran bf16 {speedup:.2f}x as fast as fp32"
    return ("bf16", probe) if speedup > BF16_MARGIN else ("fp32", probe)
