"""The package as a user installs it: a fresh virtual environment, ``pip install`` of
the project WITHOUT extras (versions held to the lock file, which also keeps it quick),
then every module of ``collector``, ``dashboard`` and ``alerts`` is imported, the CLI
answers ``--help`` and ``status`` opens a new database. A third-party import missing
from the core dependencies fails here, as numpy once did (``batchscope serve``
imported it through the batcher model while it was only in the ``testbed`` extra).

Needs PyPI (or a mirror pip is configured for), as CI has; it takes a minute or two.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
# What the project is built from (pyproject.toml's packages and readme).
SOURCES = ("pyproject.toml", "README.md", "collector", "dashboard", "alerts")
# The testbed extra's packages: a module under collector.testbed may need them (it
# drives a real Triton, which only `batchscope testbed/load/demo` do); nothing else may.
TESTBED_EXTRA = ("tritonclient", "pytriton", "triton_python_backend_utils")

IMPORT_EVERYTHING = textwrap.dedent(f"""
    import importlib, importlib.util, pkgutil, sys

    testbed_extra = {TESTBED_EXTRA!r}
    for name in testbed_extra[:2]:
        assert importlib.util.find_spec(name) is None, f"{{name}}: not a no-extras install"

    # Dash page modules register themselves with the app being built, so one must exist
    # first (dashboard.app.create_app makes the real one; pages_folder="" scans nothing).
    import dash
    dash.Dash("dashboard", use_pages=True, pages_folder="")

    imported, skipped = [], []
    for package in ("collector", "dashboard", "alerts"):
        module = importlib.import_module(package)
        assert "site-packages" in module.__file__, module.__file__  # the installed copy
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # runs its command when imported
            try:
                importlib.import_module(info.name)
            except ModuleNotFoundError as exc:
                root = (exc.name or "").split(".")[0]
                if not (info.name.startswith("collector.testbed.") and root in testbed_extra):
                    raise
                skipped.append(f"{{info.name}} (needs the testbed extra: {{root}})")
            else:
                imported.append(info.name)
    print(len(imported), "modules imported")
    for line in skipped:
        print("skipped", line)
""")


def run(*args: str | Path, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{args}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_a_no_extras_install_imports_every_module_and_runs_the_cli(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building in place would leave build/ behind
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(path, source / name)
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, timeout=120)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        ROOT / "requirements.lock",
        source,
        cwd=tmp_path,
        timeout=900,
    )

    # -I: isolated, so neither this checkout nor the test's environment is on the path.
    script = tmp_path / "import_everything.py"
    script.write_text(IMPORT_EVERYTHING)
    out = run(python, "-I", script, cwd=tmp_path, timeout=300)
    print(out.stdout)
    assert int(out.stdout.split()[0]) > 40  # the walk found the packages' modules

    help_text = run(bin_dir / "batchscope", "--help", cwd=tmp_path, timeout=60).stdout
    assert "serve" in help_text and "apply" in help_text
    serve_help = run(bin_dir / "batchscope", "serve", "--help", cwd=tmp_path, timeout=60).stdout
    assert "--triton" in serve_help and "--port" in serve_help
    # A command that creates a store, then one that reads it: the schema's migrations
    # ship with the package. (NVML alone needs no Triton target; without a GPU it only
    # records that NVML is unavailable.)
    db_url = f"sqlite:///{tmp_path}/s.db"
    collect = [bin_dir / "batchscope", "collect", "--sources", "nvml", "--duration", "1"]
    run(*collect, "--db", db_url, cwd=tmp_path, timeout=120)
    status = run(bin_dir / "batchscope", "status", "--db", db_url, cwd=tmp_path, timeout=120).stdout
    assert "no model samples yet" in status
