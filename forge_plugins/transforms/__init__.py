"""Built-in model transforms: LoRA adapters."""
