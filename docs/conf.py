"""Sphinx configuration of the jaxaot documentation (``sphinx-build -W -b html docs docs/_build/html``).

The notebooks in ``notebooks/`` (reached through the ``docs/notebooks`` link)
are executed at build time and cached (``jupyter-cache``). Set
``JAXAOT_DOCS_EXECUTE=off`` to build without executing them, as the test suite
does (``tests/test_docs.py``): the notebooks are then shown without outputs.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxaot  # noqa: E402

project = "jaxaot"
author = "the jaxaot authors"
copyright = "the jaxaot authors"
release = version = jaxaot.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build", "_templates", "**/.ipynb_checkpoints"]
html_theme = "furo"
html_title = f"jaxaot {release}"

# --- myst / myst-nb: pages in Markdown, notebooks executed at build time
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = os.environ.get("JAXAOT_DOCS_EXECUTE", "cache")
nb_execution_timeout = 300  # per cell; each notebook takes well under 2 minutes on a CPU
nb_execution_in_temp = True  # notebooks that write files write them to a temporary folder
nb_execution_raise_on_error = True
nb_merge_streams = True

# --- API reference: autosummary pages generated from the docstrings (docs/api/generated, not in git)
templates_path = ["_templates"]
autosummary_generate = True
autosummary_imported_members = True
autosummary_ignore_module_all = False  # a module's public names are its __all__
autosummary_context = {"top_level": list(jaxaot.__all__)}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
