"""File IO at the bottom of the library: atomic writes, safe ``torch.load`` of checkpoint files, RNG snapshots.

It imports nothing from ampkit but errors and the small utilities, so every layer above may use it.
Importing this package imports none of its modules.
"""
