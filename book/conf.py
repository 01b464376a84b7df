"""Sphinx configuration of the course website (``make book``; see book/build.py).

book/build.py stages the sources (the course map, the executed notebooks, the labs page,
plotly.js and MathJax) into the build folder and runs Sphinx there with this folder as the
configuration directory, so nothing executed is ever written next to the committed notebooks.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sazo_book_ext

project = "sazo-lite"
author = "the sazo-lite authors"
copyright = "the sazo-lite authors (MIT licence)"
root_doc = "README"  # the course map, notebooks/README.md; build.py adds index.html pointing to it

extensions = ["myst_nb", "sazo_book_ext"]
exclude_patterns = ["_assets", "labs", "**.ipynb_checkpoints"]

# The repository the launch buttons and the "repository" link point to. CI (GitHub Pages)
# passes the real one; the default is the project's public home.
repository_url = os.environ.get("BOOK_REPOSITORY_URL", "https://github.com/sazo-lite/sazo-lite")
repository_branch = os.environ.get("BOOK_REPOSITORY_BRANCH", "main")

# -- notebooks: book/build.py executes them first (in parallel); Sphinx only renders --------
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "html_image", "smartquotes"]
myst_heading_anchors = 3
# Static pages have no kernel: plotly figures (their JSON) first, then HTML (a dashboard's
# static view), then widget views (sazo_book_ext draws a bare FigureWidget from its saved state).
nb_mime_priority_overrides = [
    ("html", "application/vnd.plotly.v1+json", 1),
    ("html", "text/html", 2),
    ("html", "application/vnd.jupyter.widget-view+json", 3),
]
nb_ipywidgets_js = {}  # the widget manager would come from a CDN; nothing on the pages needs it
nb_merge_streams = True

# -- HTML ------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_context = {"default_mode": "light"}
html_title = "sazo-lite: fine-tuning without backpropagation"
html_static_path = ["_static"]  # book/_static; build.py's _assets (plotly.js, MathJax) are added in setup
html_css_files = ["sazo-book.css"]
html_favicon = "_static/favicon.svg"  # else browsers ask for /favicon.ico (a 404)
html_js_files = ["plotly-config.js", "plotly.min.js", "sazo-book.js"]
html_last_updated_fmt = None
html_copy_source = True
html_theme_options = {
    "repository_url": repository_url,
    "repository_branch": repository_branch,
    "path_to_docs": "notebooks",
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "notebook_interface": "jupyterlab",
        # A JupyterHub of your own (nbgitpuller installed), e.g. a university's: one more button.
        "jupyterhub_url": os.environ.get("BOOK_JUPYTERHUB_URL", ""),
    },
}

# MathJax 3 (TeX input, SVG output: no web fonts) from the django-static-mathjax wheel, served
# from the site itself (no CDN). "full": every TeX extension built in, nothing loaded later.
mathjax_path = "mathjax/tex-svg-full.js"
