"""The role adapters' (peft LoRA) forward pass, without work that changes no value.

peft computes each adapted linear layer as ``base(x) + B(A(dropout(x))) * scaling`` after casting
``x`` to the adapter's dtype. On a CPU update two parts of that cost time for nothing:

- **the input casts** (:func:`skip_adapter_input_casts`): with one dtype throughout they only
  fire inside a bf16 autocast, turning a bf16 activation into fp32 that the autocast turns straight
  back into bf16;
- **the separate scale and sum** (:func:`fuse_adapter_products`): ``B(u) * scaling`` and the sum
  with the base output are two more passes over a [tokens x width] tensor (the MLP's 1,536-wide
  ones included) in the forward pass, the recomputation and the backward pass; one ``addmm``
  (``base(x) + scaling * u Bᵀ``) does the product, the scale and the sum in one, and its backward
  pass needs no extra elementwise work either.

Both apply only to the plain case (one active adapter, no dropout, no bias on B, no DoRA or other
variant, not merged, adapters not disabled, no per-call adapter names); anything else takes peft's
own path. Values equal peft's within float rounding (tests/test_logprob_chunks.py).
"""

from __future__ import annotations

import torch
from torch import nn


def _adapter_layers(lm) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in lm.modules() if isinstance(m, BaseTunerLayer)]


def skip_adapter_input_casts(lm) -> int:
    """Stop peft casting each adapter's input to the adapter's dtype when every frozen weight and
    every adapter weight of ``lm`` share one dtype (fp32 on a CPU): an input outside an autocast
    already has that dtype, and inside a bf16 autocast the round trip bf16 -> fp32 -> bf16 is exact
    but costs two copies per adapter and layer call. With mixed dtypes (a bf16 backbone under fp32
    adapters on a GPU) peft's casts are needed and kept. Returns how many adapter layers changed."""
    if len({p.dtype for p in lm.parameters()}) != 1:
        return 0
    layers = _adapter_layers(lm)
    for module in layers:
        module.cast_input_dtype_enabled = False
    return len(layers)


def _plain(module, x, args, kwargs) -> str | None:
    """The active adapter's name when ``module``'s call is the plain LoRA case; None otherwise."""
    if args or kwargs or module.disable_adapters or module.merged:
        return None
    active = module.active_adapters
    if len(active) != 1:
        return None
    name = active[0]
    if name not in module.lora_A or name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name):
        return None
    if not isinstance(module.lora_dropout[name], nn.Identity) or module.lora_B[name].bias is not None:
        return None
    return name


def fused_forward(module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``base(x) + scaling * A(x) Bᵀ`` as one ``addmm`` on top of the base layer's output."""
    name = _plain(module, x, args, kwargs)
    if name is None:
        return type(module).forward(module, x, *args, **kwargs)
    result = module.base_layer(x)
    A = module.lora_A[name]
    u = A(module._cast_input_dtype(x, A.weight.dtype))  # peft's cast, where skip_adapter_input_casts left it on
    B = module.lora_B[name].weight
    out = torch.addmm(result.reshape(-1, result.shape[-1]), u.reshape(-1, u.shape[-1]), B.t(),
                      alpha=module.scaling[name])
    return out.view(result.shape)


def fuse_adapter_products(lm) -> int:
    """Give every peft LoRA ``Linear`` of ``lm`` the fused forward pass (:func:`fused_forward`, an
    instance attribute in front of peft's method: peft's own path stays for every other case).
    Returns how many layers got it."""
    from peft.tuners.lora.layer import Linear

    n = 0
    for module in _adapter_layers(lm):
        if type(module) is Linear:
            module.forward = fused_forward.__get__(module)
            n += 1
    return n


def unfuse_adapter_products(lm) -> int:
    """peft's own forward pass again on every LoRA ``Linear`` of ``lm``."""
    n = 0
    for module in _adapter_layers(lm):
        if "forward" in vars(module):
            del module.forward
            n += 1
    return n
