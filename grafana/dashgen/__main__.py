"""``python -m grafana.dashgen [--out DIR]``: regenerate the bundled dashboards' JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana.dashgen.catalog import DASHBOARD_DIR, write_dashboards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grafana.dashgen", description="Write the bundled Grafana dashboards."
    )
    parser.add_argument(
        "--out", type=Path, default=DASHBOARD_DIR, help=f"folder (default {DASHBOARD_DIR})"
    )
    args = parser.parse_args(argv)
    for path in write_dashboards(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
