"""The training loop and everything around it: build, step, checkpoint, metrics."""
