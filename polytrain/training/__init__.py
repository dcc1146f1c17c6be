"""The training loop: recipe, one optimizer step, the Trainer, mixed precision, the
built-in event plugins."""
