"""The number format of the training passes: fp32, or a bf16 autocast where the hardware has it.

Under ``bf16`` the passes that train (and the old-log-prob and reference passes, so that the PPO
ratio compares like with like) run inside ``torch.autocast(dtype=torch.bfloat16)``: matrix
products and attention in bf16 with fp32 accumulation, the weights, their gradients, the
optimizer and every reduction (log-softmax, losses) in fp32. The LM head of the chunked
log-probabilities (:mod:`omtr.model.logprobs`) stays fp32: a logit's bf16 rounding error
(about 0.1 at SmolLM2's magnitudes) would be a log-probability's.

bf16 pays only with native instructions (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``; a
CUDA device that supports it); elsewhere oneDNN emulates it, slower than fp32. A request for bf16
on such a device falls back to fp32 with one log line (:func:`resolve_update_dtype`).
"""

from __future__ import annotations

import contextlib
import logging
import platform

log = logging.getLogger(__name__)

from omtr.config import UPDATE_DTYPES  # noqa: E402,F401 - one list, checked without torch


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bf16_support(device: str = "cpu") -> tuple[bool, str]:
    """Whether ``device`` computes bf16 natively, and in words why not."""
    import torch

    kind = str(device).split(":", 1)[0]
    if kind == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return True, ""
        return False, "this CUDA device has no bf16 support"
    if kind != "cpu":
        return False, f"bf16 autocast is not set up for device {device!r}"
    flags = _cpu_flags()
    native = {"avx512_bf16", "amx_bf16"} & flags if platform.machine().lower() in ("x86_64", "amd64") else \
        {"bf16"} & flags
    if not native:
        return False, ("this CPU has no native bf16 instructions (avx512_bf16, amx_bf16 or Arm bf16 in its flags); "
                       "emulated bf16 is slower than fp32")
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False, f"torch {torch.__version__} was built without oneDNN's bf16 kernels"
    return True, ""


def resolve_update_dtype(name: str, device: str = "cpu") -> str:
    """The format the training passes use: ``name`` where the device supports it, else fp32 with
    one log line saying why. ``auto`` is bf16 where the device has it natively, fp32 elsewhere
    (without a warning: nothing was asked for that the device lacks)."""
    if name not in UPDATE_DTYPES:
        raise ValueError(f"update_dtype {name!r}: choose one of {', '.join(UPDATE_DTYPES)}")
    if name == "auto":
        ok, why = bf16_support(device)
        if not ok:
            log.info("update_dtype=auto: fp32, as %s", why)
        return "bf16" if ok else "fp32"
    if name == "bf16":
        ok, why = bf16_support(device)
        if not ok:
            log.warning("update_dtype=bf16 asked for, but %s: the update runs in fp32", why)
            return "fp32"
    return name


@contextlib.contextmanager
def update_autocast(name: str, device: str = "cpu"):
    """Inside: the bf16 autocast when ``name`` is ``bf16`` (already resolved); nothing for fp32."""
    if name != "bf16":
        yield
        return
    import torch

    with torch.autocast(device_type=str(device).split(":", 1)[0], dtype=torch.bfloat16):
        yield


def skip_adapter_input_casts(lm) -> int:
    """Stop peft casting each adapter's input to the adapter's dtype, where that cast can only
    waste time: when every frozen weight and every adapter weight of ``lm`` share one dtype (fp32
    on a CPU), an input outside an autocast already has that dtype; inside a bf16 autocast, peft
    would turn a bf16 activation (the attention's output before ``o_proj``, the MLP's before
    ``down_proj``) into fp32, which the autocast turns straight back into bf16 for the adapter's
    product. The round trip is exact, so values do not change; it cost two copies of a
    [tokens x width] tensor per adapter and layer call, about a tenth of a CPU update's time.

    With mixed dtypes (a bf16 backbone under fp32 adapters on a GPU) peft's casts are needed and
    kept. Returns how many adapter layers were changed."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if len({p.dtype for p in lm.parameters()}) != 1:
        return 0
    n = 0
    for module in lm.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False
            n += 1
    return n
