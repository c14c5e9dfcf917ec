"""Sphinx configuration of aiordma's documentation (build: ``./dev docs``)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import aiordma

project = "aiordma"
author = "the aiordma authors"
copyright = "2026, the aiordma authors"
release = aiordma.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "measurements/latest.json"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Modules typed for Cython (aiordma/_compiled.py) annotate with C types; to a
# Python caller they are these.
autodoc_type_aliases = {"cython.int": "int", "cython.bint": "bool", "cython.longlong": "int"}
autodoc_default_options = {"members": True, "show-inheritance": True}

# Nitpicky mode checks every cross-reference. These targets live outside
# aiordma (the standard library, pyverbs' objects; there is no network for
# intersphinx) or are internal, and are named in the prose instead.
nitpick_ignore_regex = [
    ("py:.*", r"(collections\.abc|asyncio|_asyncio|enum|typing|ipaddress)\..*"),
    ("py:class", r"pyverbs\..*|Context|PD|CQ|QP|MW|CMId"),
    # C types of modules typed for Cython, where an alias above cannot reach
    # (a class's own signature); to Python they are int and bool.
    ("py:class", r"cython\.(int|bint|longlong)"),
    ("py:class", r"distributed\..*|aiordma\.dask\.comm\.Handler|prometheus_client\..*"),
    # Ray's and numpy's own classes (aiordma.ray), and the torch types in Ray's
    # TensorTransportMetadata annotation that aiordma.ray's metadata inherits.
    ("py:class", r"ray\..*|numpy\..*|np\..*|torch\..*|concurrent\.futures\..*"),
    ("py:class", r"aiordma\.rpc\.server\.H|aiordma\.verbs\.completion\.CompletionHandler"),
    # The verbs layer's internal Protocols (docs/architecture.md, "Internal interfaces").
    (
        "py:class",
        r"(aiordma\.verbs\.queue_pair\.)?ReceiveSource|Owner|RingArrived|LaneArrived|SharedReceiveRing",
    ),
    ("py:data", r"LINGER|DEFAULT_POLL"),
    # A message channel's packet lane: internal, its own module documents it.
    ("py:class", r"(aiordma\.verbs\._lane\.)?(PacketLane|Sent|Failed)"),
    # A bulk run (QueuePair.start_bulk): internal, its own module documents it.
    ("py:class", r"(aiordma\.verbs\._bulk\.)?(BulkRun|Done|Starved)"),
    ("py:meth", r"BulkRun\..*"),
    # The transfer agents' wire identity; the stdlib's array (no inventory here).
    ("py:class", r"(aiordma\.transfer\.wire\.)?Identity|array"),
    # An agent's directory of peers: internal, its own module documents it.
    ("py:class", r"(aiordma\.transfer\.peers\.)?Peers"),
]

html_theme = "furo"
html_title = f"aiordma {release}"
html_static_path: list[str] = []
