"""``polytrain port``: a model's weights ported to another framework's model object, matched
layer by layer from the objects themselves and verified by running both."""
