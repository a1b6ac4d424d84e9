"""jaxaot's implementation. Nothing here is public: the public names are re-exported by ``jaxaot`` and its faces."""
