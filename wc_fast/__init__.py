"""wc_fast: WorldCompass RL post-training of autoregressive video world models."""

__version__ = "0.1.0"
