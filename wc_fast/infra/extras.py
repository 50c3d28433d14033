"""Optional dependencies: each is imported where it is used, and a missing one fails with the
extra of ``pyproject.toml`` that installs it, so a plain ``pip install wc_fast`` trains the
embedded world model and runs every op without them."""

from __future__ import annotations

import importlib
from types import ModuleType

# import name -> (distribution, the extra that installs it)
OPTIONAL = {
    "diffusers": ("diffusers", "wan"),
    "peft": ("peft", "lora"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "av": ("av", "video"),
}


def require(module: str, *, user: str) -> ModuleType:
    """``module`` imported, or ``ModuleNotFoundError`` saying that ``user`` (what needs it: a
    config field and value, a command) needs it and which ``pip install`` brings it."""
    distribution, extra = OPTIONAL[module]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{user} needs the {distribution} package, which is not installed ({exc}): "
            f"pip install 'wc_fast[{extra}]'", name=module) from exc
