"""The ``afd`` command: ``afd check``, ``afd launch``, ...

Each subcommand is one public module of this package that defines

* ``add_parser(subparsers) -> argparse.ArgumentParser``: add the subcommand to
  ``subparsers`` (the object ``ArgumentParser.add_subparsers`` returns) and return its
  parser;
* ``run(args: argparse.Namespace) -> int``: do the work and return the exit status.

:func:`main` finds these modules itself (modules whose name starts with ``_`` are
skipped: :mod:`afd_core.tools.cli._inputs` holds the exit statuses and the checks of a user's
input that the subcommands share), so adding a subcommand means adding one module and
touching nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The ``afd`` argument parser with every subcommand module of this package."""
    parser = argparse.ArgumentParser(
        prog="afd", description="Attention-FFN Disaggregation (AFD) for vLLM."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        sub = module.add_parser(subparsers)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``afd`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit status.

    Usage errors exit through argparse with status 2.
    """
    args = build_parser().parse_args(argv)
    return int(args.run(args))
