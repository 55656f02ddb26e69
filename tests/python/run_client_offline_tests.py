#!/usr/bin/env python3
"""The Python client's offline tests (python/tests/, no server needed), against the installed client.

    run_client_offline_tests.py REPO_ROOT

Makes a fresh virtualenv in a scratch directory and installs the client there offline, from
Debian's packages only (client_venv.py, beside this file: `--system-site-packages`, `pip install
--no-build-isolation --no-index`; no package registry is contacted), then runs
`python -m unittest discover -s python/tests -v` under the venv's python, from the scratch
directory so that no source tree shadows the installed package (the source tree has no generated
stubs). Exit 0: every test passed. Stdlib only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from client_venv import VenvFailure, clean_env, make_venv

UNITTEST_TIMEOUT_S = 120


def bare_python_refused(repo: Path, tmp: Path) -> bool:
    """An offline install into a venv that sees none of Debian's packages fails naming them.

    Without grpcio, protobuf and numpy (and, with an older setuptools, wheel) pip would stop at
    "invalid command 'bdist_wheel'" or at a requirement it cannot find; python/setup.py says
    instead which packages the offline build needs and how to get them.
    """
    bare = tmp / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=120, env=clean_env())
    r = subprocess.run([str(bare / "bin" / "python"), "-m", "pip", "install", "--isolated", "--no-input",
                        "--disable-pip-version-check", "--no-build-isolation", "--no-index",
                        str(tmp / "src" / "python")],
                       capture_output=True, text=True, timeout=180, cwd=tmp, env=clean_env())
    out = r.stdout + r.stderr
    want = ("lacks python3-grpcio, python3-protobuf, python3-numpy", "--system-site-packages")
    if r.returncode == 0 or not all(w in out for w in want):
        print(f"FAIL: pip install into a bare venv: exit {r.returncode}, wanted {want} in:\n{out}")
        return False
    print("a bare venv's offline install is refused naming Debian's packages")
    return True


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = Path(sys.argv[1]).resolve()
    tests = repo / "python" / "tests"
    if not tests.is_dir():
        print(f"FAIL: {tests} is missing")
        return 1
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="dmhnsw-pyoffline-"))
    try:
        py = make_venv(repo, tmp)
        # the copy make_venv installed from, so the tests match the installed sources
        r = subprocess.run([str(py), "-m", "unittest", "discover", "-s", str(tmp / "src" / "python" / "tests"),
                            "-t", str(tmp / "src" / "python" / "tests"), "-v"],
                           cwd=tmp, env=clean_env(), timeout=UNITTEST_TIMEOUT_S)
        ok = r.returncode == 0
        if not ok:
            print(f"FAIL: unittest exited {r.returncode}")
        ok = bare_python_refused(repo, tmp) and ok
    except VenvFailure as e:
        print(f"FAIL: {e}")
        ok = False
    except subprocess.TimeoutExpired:
        print(f"FAIL: the offline tests did not finish in {UNITTEST_TIMEOUT_S} s")
        ok = False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'PASS' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
