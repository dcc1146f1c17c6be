"""Files: neutral checkpoints, the native weight formats the plugins declare, and
conversion between them."""
