"""Device names: the one place where a name from a config or an option becomes a torch device.

Config validation (:func:`transformer_mt.config.check_device_name`) checks only the spelling,
before any work and without touching the hardware; :func:`resolve_device` then checks that this
process can use the device, with a one-line error naming the key or option it came from.
"""

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
