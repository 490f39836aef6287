"""Step 05 — smoke: the launched server answers (models, chat, streaming, context limits, needles,
speculative decoding, the API key), then the quality gate."""
from .cases import run

__all__ = ["run"]
