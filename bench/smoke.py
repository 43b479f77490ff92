"""``--smoke``, the flag every bench takes: a run at tiny sizes, in seconds, so that no benchmark rots unnoticed
(``tests/e2e/test_bench_smoke.py`` runs each bench so).

A smoke run goes through the same code as a real one (the same clusters, processes and phases, at sizes that take
seconds) and prints the same JSON; its figures mean nothing. It only changes the defaults: a flag given beside
``--smoke`` still wins.
"""

import argparse
from collections.abc import Mapping
from typing import Any

FLAG = "--smoke"


def parse_args(parser: argparse.ArgumentParser, tiny: Mapping[str, Any]) -> argparse.Namespace:
    """``parser``'s arguments, with ``--smoke`` added: given, the defaults named in ``tiny`` (by ``dest``) are those."""
    unknown = set(tiny) - set(vars(parser.parse_known_args([])[0]))
    if unknown:  # a misspelt name would otherwise leave the real size in force, silently
        raise ValueError(f"smoke defaults for arguments the parser does not have: {sorted(unknown)}")
    parser.add_argument(FLAG, action="store_true", help="tiny sizes that run in seconds; the figures mean nothing")
    if parser.parse_known_args()[0].smoke:
        parser.set_defaults(**tiny)
    return parser.parse_args()
