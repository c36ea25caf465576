"""Instructions per target-scrape of the ``triton`` source's whole cycle, counted by
callgrind: a figure that does not move with the machine's load, to compare revisions.

Runs ``bench/scrape_cycle.py`` (one Triton-like server, one ``TritonSource``, fetch,
parse, rates and the store write) under ``valgrind --tool=callgrind``, counting only
the measured scrapes (they run inside one ``functools.reduce`` call, the one function
collection is toggled on), for this checkout and, with ``--against``, another one, both
at once. Instructions are not seconds: the system calls' kernel time and cache misses
are not in them, so the collector bench (``bench.collector``) stays the measure against
Prometheus; this one says what a change did to the CPU's work, repeatably.

    .venv/bin/python -m bench.scrape_instructions --against ../main-before-a-change
    .venv/bin/python -m bench.scrape_instructions --models 100 --scrapes 50
    .venv/bin/python -m bench.scrape_instructions --part rates   # one part alone

Needs valgrind (Debian's ``valgrind`` package); the run takes a minute or two, most of
it the imports under valgrind.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.scrape_cycle import PARTS

ROOT = Path(__file__).resolve().parent.parent
_REFS = re.compile(r"refs:\s+([\d,]+)")


def count(tree: Path, args: argparse.Namespace, out: Path) -> int:
    """Instructions of ``args.scrapes`` scrapes with ``tree``'s collector (callgrind's
    own output to ``out``)."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(ROOT / "bench" / "scrape_cycle.py"),
        f"--models={args.models}",
        f"--scrapes={args.scrapes}",
        f"--warmup={args.warmup}",
        f"--statistics-every={args.statistics_every}",
        f"--collector-root={tree}",
        f"--part={args.part}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = done.stderr[-2000:]
        raise SystemExit(f"callgrind run of {tree} failed ({done.returncode}):\n{tail}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--statistics-every", type=int, default=5, help="as collect's default at a 1 s interval"
    )
    parser.add_argument("--against", default="", help="another checkout, counted side by side")
    parser.add_argument(
        "--part",
        choices=PARTS,
        default="cycle",
        help="count one part of the cycle alone: the GETs, the metrics page, the statistics "
        "document, the rates or the store write",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found: install Debian's valgrind package")
    trees = [ROOT] + ([Path(args.against).resolve()] if args.against else [])
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(trees)) as pool:
        counts = list(
            pool.map(
                lambda i: count(trees[i], args, Path(tmp) / f"callgrind.{i}"), range(len(trees))
            )
        )
    what = "" if args.part == "cycle" else f" of the {args.part} part"
    print(
        f"{args.models} models, {args.scrapes} scrapes, statistics every "
        f"{args.statistics_every}: instructions per target-scrape{what}"
    )
    for tree, total in zip(trees, counts, strict=True):
        print(f"  {total / args.scrapes / 1e6:8.2f} M  {tree}")
    if len(counts) == 2:
        print(f"  ratio {counts[0] / counts[1]:.3f} (this checkout / --against)")


if __name__ == "__main__":
    main()
