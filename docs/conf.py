"""Sphinx configuration: MyST Markdown pages, the furo theme, autodoc for the API page.

Build: ``sphinx-build -W -b html docs docs/_build/html`` (tests/test_docs.py runs it).
The capability tables and the CLI reference are generated from the code (committed under
``docs/_generated/``, written by ``python docs/_ext/emulate_docs.py``).
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

import emulate  # noqa: E402

project = "emulate"
author = "the emulate authors"
copyright = "the emulate authors"
release = emulate.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "emulate_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"emulate {release}"
html_static_path: list[str] = []
