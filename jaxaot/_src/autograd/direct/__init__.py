"""Eager gradients straight to the compiled programs of ``aot_function`` and ``aot_module``.

Modules, bottom up: ``function`` (an ``aot_function``'s gradient on its
executables), ``flax_functions`` (Flax's gradient transformations, bound before
any patch), ``module`` (an ``aot_module``'s loss as one compiled step; imports
Flax, loaded only once a module is differentiated), ``api``
(:func:`value_and_grad`, :func:`grad`: the dispatch) and ``patch``
(:func:`patch_value_and_grad`: Flax's names take the compiled step).
"""

from jaxaot._src.autograd.direct.api import grad, value_and_grad
from jaxaot._src.autograd.direct.patch import patch_value_and_grad

__all__ = ["grad", "patch_value_and_grad", "value_and_grad"]
