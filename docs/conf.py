"""Sphinx configuration of the jaxaot documentation (``sphinx-build -W -b html docs docs/_build/html``).

The notebooks in ``notebooks/`` (reached through the ``docs/notebooks`` link)
are executed at build time and cached (``jupyter-cache``). Set
``JAXAOT_DOCS_EXECUTE=off`` to build without executing them, as the test suite
does (``tests/test_docs.py``): the notebooks are then shown without outputs.
Each notebook read is logged with its place and, once parsed (and executed),
its time (:func:`setup`), since a build that executes them takes minutes.
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
# The core's names, not the faces (the modules jaxaot.<name>): a face naming one links to its page under jaxaot.
autosummary_context = {"top_level": [n for n in jaxaot.__all__
                                     if getattr(getattr(jaxaot, n), "__name__", None) != f"jaxaot.{n}"]}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False


# --- progress: executing the notebooks takes minutes; say which one runs and how long it took
def _notebook_progress(app):
    """Log ``notebook 2/6: notebooks/02_... (executing unless cached)`` as each notebook is read, then its time.

    myst-nb executes a notebook while parsing it, between Sphinx's ``source-read``
    and ``doctree-read`` events for that document; ``env-before-read-docs`` says
    which documents this build reads, so the count is of the notebooks it reads.
    Silent under ``JAXAOT_QUIET=1`` and with ``sphinx-build -q``.
    """
    import time

    from sphinx.util import logging as sphinx_logging

    from jaxaot._src import progress as _progress

    log = sphinx_logging.getLogger("jaxaot.docs")
    state = {"notebooks": [], "started": {}}

    def before_read(app, env, docnames):
        state["notebooks"] = [d for d in docnames if str(env.doc2path(d)).endswith(".ipynb")]

    def source_read(app, docname, source):
        if docname in state["notebooks"] and not _progress.quiet():
            k, n = state["notebooks"].index(docname) + 1, len(state["notebooks"])
            how = {"off": "not executed", "cache": "executing unless cached"}.get(nb_execution_mode, "executing")
            log.info(f"notebook {k}/{n}: {docname} ({how})")
            state["started"][docname] = time.perf_counter()

    def doctree_read(app, doctree):
        docname = app.env.docname
        if docname in state["started"]:
            log.info(f"notebook {docname}: done ({time.perf_counter() - state['started'].pop(docname):.1f} s)")

    app.connect("env-before-read-docs", before_read)
    app.connect("source-read", source_read)
    app.connect("doctree-read", doctree_read)


def setup(app):
    _notebook_progress(app)
    return {"parallel_read_safe": True}
