"""The compiled programs of one ``aot_module`` and the options they were built with.

:class:`ModulePrograms` travels in the module's graph metadata, not its state, so
``nnx.split`` / ``nnx.merge``, ``nnx.clone`` and Flax transformations hand the
programs to the module they rebuild. It is hashed by identity: wrappers share a
compile cache exactly when they share it. Pickling keeps the options and compiles
again after loading.

Example:
    >>> programs = ModulePrograms("__call__", (), (), {})
    >>> import copy, pickle
    >>> copy.deepcopy(programs) is programs, pickle.loads(pickle.dumps(programs)).method
    (True, '__call__')
"""

from __future__ import annotations

from typing import Any

from jaxaot._src.nn.leaf_names import names_for
from jaxaot._src.nn.module_call import Method
from jaxaot._src.nn.pure import nnx_call_pure, nnx_loss_pure
from jaxaot._src.runtime import AOTFunction, aot_function


class ModulePrograms:
    """The module call's program and its loss program (:mod:`jaxaot._src.nn.loss_call`), with their options.

    Attributes:
      method, static_argnums, static_argnames: as given to :func:`~jaxaot.nn.aot_module`.
      module_type: the wrapped module's class, whose method names the call's arguments in cache entries.
      aot_kwargs: the :func:`jaxaot.aot_function` options (compilers, partitioner, decompositions).
      program: the ``aot_function`` of :func:`~jaxaot._src.nn.pure.nnx_call_pure`.
      loss_program: the ``aot_function`` of :func:`~jaxaot._src.nn.pure.nnx_loss_pure`.
      reads_numbers: the module's Python read the value of a Python number it was given: numbers passed to the
        call are statics (:func:`~jaxaot._src.nn.module_call.run_reading_numbers`).
    """

    def __init__(self, method: Method, static_argnums: tuple, static_argnames: tuple, aot_kwargs: dict,
                 module_type: type | None = None):
        self.method = method
        self.module_type = module_type
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.aot_kwargs = dict(aot_kwargs)
        self.program: AOTFunction = aot_function(nnx_call_pure, static_argnums=0, **self.aot_kwargs)
        self.loss_program: AOTFunction = aot_function(nnx_loss_pure, static_argnums=0, **self.aot_kwargs)
        self.program._names_for = names_for(module_type, method)
        self.loss_program._names_for = names_for()
        self.reads_numbers = False

    # Identity semantics (object's __eq__ and __hash__): the graphdefs of copies compare equal.
    def __copy__(self) -> "ModulePrograms":
        return self

    def __deepcopy__(self, memo: Any) -> "ModulePrograms":
        return self

    def __reduce__(self) -> tuple:
        return ModulePrograms, (self.method, self.static_argnums, self.static_argnames, self.aot_kwargs,
                                self.module_type)

    def __repr__(self) -> str:
        return f"ModulePrograms(method={getattr(self.method, '__name__', self.method)!r})"


__all__ = ["ModulePrograms"]
