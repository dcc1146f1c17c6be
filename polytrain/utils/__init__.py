"""Framework-free helpers every layer may use: atomic files, thread settings, a safe unpickler."""
