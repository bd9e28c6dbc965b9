"""Where and at what precision training runs.

The device, the process's place in the job, the
CPU memory settings, and autocast."""

import warnings
from contextlib import AbstractContextManager, nullcontext

import torch

from transformer_mt.config import TrainConfig
from transformer_mt.devices import (  # noqa: F401 (the precision choice, importable from here)
    BF16_MARGIN,
    choose_precision,
    cpu_has_native_bf16,
    resolve_device,
)
from transformer_mt.errors import MTError
from transformer_mt.host_memory import bound_kernel_caches, keep_freed_memory
from transformer_mt.training import distributed

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
    """The autocast dtype of ``train.precision`` (None for fp32), checked on ``device``.

    The check is that autocast runs the dtype on ``device``. torch does not raise for an
    unsupported autocast dtype: it warns and runs in fp32, which would silently train at another
    precision than the config says.
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
