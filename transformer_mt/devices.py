"""Device names and precision: where a name from a config or an option becomes a torch device.

Config validation (:func:`transformer_mt.config.check_device_name`) checks only the spelling,
before any work and without touching the hardware; :func:`resolve_device` then checks that this
process can use the device, with a one-line error naming the key or option it came from.
:func:`choose_precision` is ``precision: auto``'s choice, for training and for translating.
"""

import statistics
import time

import torch

from transformer_mt.errors import MTError


def resolve_device(name: str | torch.device, key: str = "--device") -> torch.device:
    """Resolve a device name to a torch device this process can use.

    ``name`` ("auto", "cpu", "cuda", "cuda:N", "mps") as a torch device this process can use;
    "auto" is the GPU when one is visible, else the CPU. ``key`` names where it came from."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cpu = f"{key} cpu" if key.startswith("--") else f"{key}=cpu"  # what to use instead
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise MTError(f"{key} {name!r}: not a device name; use cpu, cuda, cuda:1, ...") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise MTError(
                f"{key} {name}: no CUDA GPU is visible to this process (torch.cuda.is_available()"
                f" is false); use {cpu}, or check the driver and CUDA_VISIBLE_DEVICES"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise MTError(f"{key} {name}: only {count} GPU(s) visible (cuda:0 to cuda:{count - 1})")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise MTError(f"{key} {name}: MPS is not available on this machine; use {cpu}")
    elif device.type != "cpu":
        raise MTError(f"{key} {name}: expected cpu, cuda, cuda:N or mps")
    return device


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


BF16_MARGIN = 1.15  # bf16 is chosen only this much faster: a noisy probe must not flip a choice


def probe_bf16_speedup(device: torch.device, d_model: int, ffn_hidden: int, rows: int) -> float:
    """How many times faster a product at the model's shapes runs in bf16 than in fp32.

    The product is (rows, d_model) x (d_model, ffn_hidden), forward, as autocast runs it. The
    result is the median of 5 ratios, each of an fp32 and a bf16 timing taken one after the other
    (so that a busy machine slows both alike), each timing repeating the product for about 2 ms.
    The probe takes some tens of milliseconds."""
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

    seconds(False), seconds(True)  # warm-up: kernels chosen, caches filled
    return statistics.median(seconds(False) / seconds(True) for _ in range(5))


def choose_precision(
    device: torch.device, d_model: int, ffn_hidden: int, rows: int
) -> tuple[str, str]:
    """Choose what ``precision: auto`` means here (``train.precision``, ``decode.precision``).

    bf16 where the device runs it natively and a short probe at the model's shapes measures it
    faster than fp32 (by ``BF16_MARGIN``), else fp32; returns (the choice, why)."""
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
