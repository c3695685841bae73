"""Sphinx configuration (MyST Markdown pages; build with `make docs`)."""

project = "rbdata"
author = "rbdata developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
