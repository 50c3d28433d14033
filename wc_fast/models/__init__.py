"""World models: the protocol the trainer uses and the embedded TinyWorldDiT."""

from wc_fast.models.protocol import ContextCache, FrameCodec, PixelFrames, WorldModel
from wc_fast.models.tiny.dit import PROMPT_ACTION, TinyWorldDiT

__all__ = ["ContextCache", "FrameCodec", "PixelFrames", "WorldModel", "TinyWorldDiT",
           "PROMPT_ACTION"]
