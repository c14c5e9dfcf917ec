"""An import-linter contract type: no package imports another package's private modules.

``lint-imports`` loads it through ``contract_types`` in ``pyproject.toml``.
A module whose own name starts with an underscore (``aiordma.verbs._engine``,
``aiordma.cm._rdmacm``) is private to the package that holds it: modules of
that package, and of packages inside it, may import it; nothing else may.
Private modules directly under the root (``aiordma._pyverbs``) belong to
the whole library. Type-checking imports count, like any other.
"""

from __future__ import annotations

import grimp
from importlinter import Contract, ContractCheck, fields, output


def owner(module: str) -> str | None:
    """The package a private module belongs to, or None if the module is not private."""
    parts = module.split(".")
    for depth, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:depth])
    return None


def illegal(importer: str, imported: str, root: str) -> bool:
    """Whether ``importer`` may not import ``imported`` under this contract."""
    package = owner(imported)
    if package is None or package == root:
        return False
    return importer != package and not importer.startswith(package + ".")


class PrivateModulesContract(Contract):
    """Only a private module's own package imports it (``root`` owns its direct children)."""

    type_name = "private_modules"

    root = fields.StringField()

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        root = str(self.root)
        links = []
        for imported in sorted(graph.modules):
            if owner(imported) in (None, root):
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if illegal(importer, imported, root):
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = tuple(d["line_number"] for d in details)
                    links.append((importer, imported, lines))
        return ContractCheck(kept=not links, warnings=[], metadata={"links": links})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["links"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print_error(f"{importer} -> {imported} ({where})", bold=False)
            output.new_line()
