"""The bottom layer: small helpers every other layer may use. Its modules import nothing from ampkit."""
