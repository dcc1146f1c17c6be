"""The parity harness: one recipe on several backends, lockstep replay, the comparison report."""
