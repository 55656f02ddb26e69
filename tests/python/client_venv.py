"""A fresh virtualenv with the Python client (python/) installed offline, for the ctests.

Shared by test_client_live.py and test_client_offline.py (beside this file). Stdlib only.

The route is the offline one of python/README.md, so no test touches a package registry:

    /usr/bin/python3 -m venv --system-site-packages VENV
    VENV/bin/python -m pip install --isolated --no-build-isolation --no-index ./python

The venv sees Debian's python3-grpcio, python3-protobuf, python3-numpy, python3-setuptools and
python3-wheel (tools/install-deps.sh installs them); setup.py generates the stubs with the system
protoc and grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc), so generator and
runtime match. The sources are copied (python/ and proto/) into the scratch directory first, so
setuptools' in-tree build output never lands in the checkout. `--isolated` and the environment
below keep the developer's pip configuration, PYTHONPATH and user site-packages out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

SYSTEM_PYTHON = "/usr/bin/python3"
VENV_TIMEOUT_S = 120
PIP_TIMEOUT_S = 180
IMPORT_TIMEOUT_S = 60


class VenvFailure(Exception):
    """The virtualenv could not be made, or the client does not install or import in it."""


def clean_env() -> dict:
    """os.environ without what would make the venv see other packages or pip configuration."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE",
                                                        "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"  # a --system-site-packages venv would else see ~/.local too
    return env


def make_venv(repo: Path, tmp: Path, remaining: Callable[[float], float] = lambda cap: cap,
              log: Callable[[str], None] = print) -> Path:
    """A fresh virtualenv in tmp/venv with the client of `repo` installed; its python's path.

    `remaining(cap)` gives the seconds a step may take (the caller's deadline); VenvFailure with
    the command's output when a step fails.
    """
    src = tmp / "src"
    shutil.copytree(repo / "python", src / "python",
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".venv",
                                                  "*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py"))
    (src / "proto").mkdir()
    shutil.copyfile(repo / "proto" / "dmhnsw.proto", src / "proto" / "dmhnsw.proto")
    venv = tmp / "venv"
    env = clean_env()

    def run(what: str, argv: list, cap: float) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=remaining(cap), cwd=tmp, env=env)
        except subprocess.TimeoutExpired as e:
            raise VenvFailure(f"{what} did not finish in {cap} s: {' '.join(argv)}\n"
                              f"{e.stdout or ''}{e.stderr or ''}") from None
        if r.returncode != 0:
            raise VenvFailure(f"{what} failed ({r.returncode}): {' '.join(argv)}\n{r.stdout}{r.stderr}")
        return r.stdout

    run("python3 -m venv", [SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)], VENV_TIMEOUT_S)
    py = venv / "bin" / "python"
    run("pip install (offline)",
        [str(py), "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-input",
         "--no-build-isolation", "--no-index", "--quiet", str(src / "python")], PIP_TIMEOUT_S)
    out = run("importing the installed client",
              [str(py), "-c", "import dmhnsw, dmhnsw.client, numpy, grpc, google.protobuf as pb\n"
                              "print(dmhnsw.__file__)\n"
                              "print(dmhnsw.__version__, numpy.__version__, grpc.__version__, pb.__version__)"],
              IMPORT_TIMEOUT_S)
    where, versions = (out.strip().splitlines() + ["", ""])[:2]
    if not Path(where).resolve().is_relative_to(venv.resolve()):
        raise VenvFailure(f"dmhnsw was imported from {where}, not from the venv {venv}")
    log(f"venv ready (offline install): dmhnsw, numpy, grpcio, protobuf = {versions}")
    return py
