"""Eager gradients straight to the compiled programs of ``aot_function`` and ``aot_module``.

Modules, bottom up: ``function_grad`` (an ``aot_function``'s gradient on its
executables), ``flax_functions`` (Flax's gradient transformations, bound before
any patch), ``module`` (an ``aot_module``'s loss as one compiled step; imports
Flax, loaded only once a module is differentiated), ``dispatch``
(:func:`value_and_grad`, :func:`grad`) and ``flax_patch``
(:func:`patch_value_and_grad`: Flax's names take the compiled step).
"""

from jaxaot._src.autograd.direct.dispatch import grad, value_and_grad
from jaxaot._src.autograd.direct.flax_patch import patch_value_and_grad

__all__ = ["grad", "patch_value_and_grad", "value_and_grad"]
