"""Stage 1, trace: a user function to its primal jaxpr and its joint forward+backward jaxpr."""
