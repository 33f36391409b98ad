"""Helpers for runs launched by torchrun: decisions every rank takes together."""

from .agreement import agree_max, agree_min, world_size

__all__ = ["agree_max", "agree_min", "world_size"]
