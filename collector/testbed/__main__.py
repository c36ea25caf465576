"""``python -m collector.testbed testbed up`` / ``... load``: the testbed commands alone."""

from collector.testbed.cli import main

raise SystemExit(main())
