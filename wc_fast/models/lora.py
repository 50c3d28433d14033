"""LoRA adapters through ``peft`` on a module's linear layers, reproducibly seeded."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from wc_fast.infra.extras import require


def import_peft() -> ModuleType:
    """``peft``, or a ``ModuleNotFoundError`` naming ``model.lora_rank`` and the extra that
    installs it."""
    return require("peft", user="model.lora_rank > 0")


def inject_lora(module: nn.Module, rank: int, alpha: float, targets: tuple[str, ...], *,
                seed: int = 0) -> None:
    """LoRA adapters of ``rank`` on ``module``'s linears named by ``targets`` (peft's
    ``target_modules``: a name or its last dotted parts), scaled by ``alpha / rank`` (``alpha``
    0: the rank). peft starts each second factor at zero (the module's outputs unchanged) and
    draws the first from the global generator, seeded here with ``seed`` and restored after.
    A target naming no linear raises ``ValueError`` naming ``model.lora_targets``."""
    peft = import_peft()
    names = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ValueError(f"model.lora_targets {missing} name no linear layer of the "
                         f"transformer (its linears include {names[:8]})")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha or rank, target_modules=list(targets))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft.inject_adapter_in_model(config, module)


def lora_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Both factors of every LoRA adapter in ``module``."""
    return [p for m in module.modules() if hasattr(m, "lora_A")
            for factors in (m.lora_A, m.lora_B) for p in factors.parameters()]
