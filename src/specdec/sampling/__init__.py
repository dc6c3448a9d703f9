"""Logits -> probabilities, once, with the same processing for target and draft."""

from specdec.sampling.params import SamplingParams, is_whole, process_logits, sample_token, sample_tokens

__all__ = ["SamplingParams", "is_whole", "process_logits", "sample_token", "sample_tokens"]
