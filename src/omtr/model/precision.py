"""The number format of the training passes: fp32, or a bf16 autocast where the hardware has it.

Under ``bf16`` the passes that train (and the old-log-prob and reference passes, so that the PPO
ratio compares like with like) run inside ``torch.autocast(dtype=torch.bfloat16)``: matrix
products and attention in bf16 with fp32 accumulation, the weights, their gradients, the
optimizer and every reduction (log-softmax, losses) in fp32. The LM head of the chunked
log-probabilities (:mod:`omtr.model.logprobs`) stays fp32: a logit's bf16 rounding error
(about 0.1 at SmolLM2's magnitudes) would be a log-probability's.

bf16 pays only with native instructions (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``; a
CUDA device that supports it); elsewhere oneDNN emulates it, slower than fp32. A request for bf16
on such a device falls back to fp32 with one log line (:func:`resolve_update_dtype`). Native
instructions are not enough either: without AMX, a 2-core Xeon's bf16 products ran at about half
its fp32 speed, so ``auto`` also asks a probe (:func:`bf16_pays`).
"""

from __future__ import annotations

import contextlib
import functools
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
        ok, why = bf16_preferred(device)
        if not ok:
            log.info("update_dtype=auto: fp32, as %s", why)
        return "bf16" if ok else "fp32"
    if name == "bf16":
        ok, why = bf16_support(device)
        if not ok:
            log.warning("update_dtype=bf16 asked for, but %s: the update runs in fp32", why)
            return "fp32"
    return name


def bf16_preferred(device: str = "cpu") -> tuple[bool, str]:
    """What ``auto`` asks wherever a format is chosen (the update here, the fast engine's wide
    passes): bf16 only where ``device`` has it natively (:func:`bf16_support`) and it computes
    faster there (:func:`bf16_pays`); else False and in words why not."""
    ok, why = bf16_support(device)
    return bf16_pays(device) if ok else (ok, why)


# bf16 must beat fp32 by this factor on the probe's product for `auto` to choose it
BF16_MIN_GAIN = 1.15


@functools.lru_cache(maxsize=None)
def bf16_pays(device: str = "cpu") -> tuple[bool, str]:
    """Whether bf16 matrix products are faster than fp32 ones on ``device``, and in words why not.

    A CPU that has bf16 instructions does not always compute bf16 faster: measured on a 2-core Xeon
    with avx512_bf16 but no AMX, torch's fp32 product of SmolLM2's MLP shape ran at ~340 GFLOP/s
    and its bf16 one at ~185 (attention likewise), so the update under a bf16 autocast took 1.5x
    as long. On a CPU the answer is a probe: the same product in both formats (a [1024, 576] x
    [576, 1536] linear, best of three after a warm-up; well under a second), once per process.
    Elsewhere (CUDA) bf16 pays wherever it is supported."""
    if str(device).split(":", 1)[0] != "cpu":
        return True, ""
    import time

    import torch

    x, w = torch.randn(1024, 576), torch.randn(1536, 576)
    flops = 2 * x.shape[0] * x.shape[1] * w.shape[0]

    def best(dtype) -> float:
        xx, ww = x.to(dtype), w.to(dtype)
        torch.nn.functional.linear(xx, ww)  # oneDNN builds its kernel on the first call
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            torch.nn.functional.linear(xx, ww)
            times.append(time.perf_counter() - t0)
        return min(times)

    t32, t16 = best(torch.float32), best(torch.bfloat16)
    if t16 * BF16_MIN_GAIN <= t32:
        return True, ""
    return False, (f"this CPU's bf16 products are not faster than its fp32 ones (measured {flops / t16 / 1e9:.0f} "
                   f"against {flops / t32 / 1e9:.0f} GFLOP/s)")


@contextlib.contextmanager
def update_autocast(name: str, device: str = "cpu"):
    """Inside: the bf16 autocast when ``name`` is ``bf16`` (already resolved); nothing for fp32."""
    if name != "bf16":
        yield
        return
    import torch

    with torch.autocast(device_type=str(device).split(":", 1)[0], dtype=torch.bfloat16):
        yield
