"""mtl_cog: accurate and calibrated (multi-task) networks in one training run (COG)."""

__version__ = "0.1.0"
