"""Stage 2, partition: decide what the forward saves for the backward and split the joint graph."""
