"""The built-in training objectives: ``lm`` (next-token cross-entropy) and ``dpo``
(preference pairs: DPO, IPO, reference-free)."""
