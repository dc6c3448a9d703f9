"""specdec: speculative decoding with provably identical output."""

__version__ = "0.1.0"
