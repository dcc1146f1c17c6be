"""The framework-neutral model of training: layer specs and the model zoo, the numpy
reference, canonical optimizers, sharding."""
