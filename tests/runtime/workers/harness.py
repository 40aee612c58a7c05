"""Case registry for rank-side test workers: `@case` functions run in order on every rank.

A failing case records its traceback and the run continues (after a barrier-free pause, the next
case uses fresh names, so one failure does not cascade). Results go to <out_dir>/rank<R>.json.
"""
from __future__ import annotations

import json
import sys
import traceback

CASES = []


def expect(exc_type, call, *fragments) -> str:
    """Run `call`, which must raise `exc_type` with every fragment in its message; returns the message."""
    try:
        call()
    except exc_type as e:
        missing = [f for f in fragments if f not in str(e)]
        assert not missing, f"{exc_type.__name__} message lacks {missing}: {e}"
        return str(e)
    raise AssertionError(f"expected {exc_type.__name__}")


def case(fn):
    CASES.append(fn)
    return fn


def main(hvd) -> None:
    out_dir = sys.argv[1]
    hvd.init()
    results = {}
    for fn in CASES:
        try:
            fn()
            results[fn.__name__] = None
        except Exception:
            results[fn.__name__] = traceback.format_exc(limit=6)[-3000:]
    with open(f"{out_dir}/rank{hvd.rank()}.json", "w") as f:
        json.dump(results, f)
    hvd.shutdown()
