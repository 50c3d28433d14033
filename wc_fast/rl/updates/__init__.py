"""Update rules of one RL iteration (docs/design.md section 4.4): the interface
(:class:`Update`), NFT and Flow-GRPO, and the factory that picks one from ``train.update``."""

from wc_fast.config import Config
from wc_fast.rl.updates.base import CPU_MICRO_BATCH, Items, MicroLoss, Update, UpdateContext
from wc_fast.rl.updates.grpo import GRPOItems, GRPOUpdate
from wc_fast.rl.updates.nft import NFTItems, NFTUpdate

# ``train.update`` -> its rule
UPDATES: dict[str, type[Update]] = {"nft": NFTUpdate, "flow_grpo": GRPOUpdate}


def build_update(cfg: Config) -> Update:
    """The update rule ``cfg.train.update`` names."""
    name = cfg.train.update
    if name not in UPDATES:
        raise ValueError(f"train.update must be one of {sorted(UPDATES)}, got {name!r}")
    return UPDATES[name](cfg)


__all__ = ["CPU_MICRO_BATCH", "Items", "MicroLoss", "Update", "UpdateContext", "NFTItems",
           "NFTUpdate", "GRPOItems", "GRPOUpdate", "UPDATES", "build_update"]
