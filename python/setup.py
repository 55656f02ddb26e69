"""Build hook of the dmhnsw client: generates the gRPC stubs from ``../proto/dmhnsw.proto``.

The stubs (``dmhnsw/_proto/dmhnsw_pb2.py``, ``dmhnsw_pb2_grpc.py`` and ``dmhnsw_pb2.pyi``) are
written into the build directory by ``build_py`` (into the source tree only for an editable
install, where .gitignore covers them), never committed. The .proto is copied into a temporary
tree as ``dmhnsw/_proto/dmhnsw.proto`` before protoc runs, so the generated ``_grpc`` module
imports ``from dmhnsw._proto import dmhnsw_pb2`` and works inside the package.

Where the .proto is looked for, first found wins:
  1. ``$DMHNSW_PROTO`` (a path to dmhnsw.proto), when set;
  2. ``../proto/dmhnsw.proto`` relative to this file (the repository layout);
  3. ``proto/dmhnsw.proto`` relative to this file (the copy an sdist carries).

Which compiler generates them, first usable wins:
  1. grpcio-tools (``grpc_tools.protoc``), when importable and at least 1.49 (the first with
     ``--pyi_out``): the ordinary build, where pip fetches it from PyPI into an isolated build
     environment (pyproject.toml's build requirements);
  2. the system ``protoc`` (``$DMHNSW_PROTOC``, else ``protoc`` on PATH) with gRPC's
     ``grpc_python_plugin`` (``$DMHNSW_GRPC_PYTHON_PLUGIN``, else on PATH, else beside protoc):
     the offline build on Debian (protobuf-compiler, protobuf-compiler-grpc), with
     ``pip install --no-build-isolation --no-index`` in a ``--system-site-packages`` venv that
     sees python3-grpcio and python3-protobuf. Setting ``$DMHNSW_PROTOC`` forces this route.
Generator and runtime then come from the same distribution, which is the point: stubs of a newer
grpcio-tools call APIs (``_registered_method=``, ``ValidateProtobufRuntimeVersion``) that an
older grpcio or protobuf lacks.

The runtime dependencies are computed here too, from freshly generated stubs: newer generators
write the oldest grpcio (``GRPC_GENERATED_VERSION``) and protobuf
(``ValidateProtobufRuntimeVersion``) the stubs accept, and the wheel requires at least those.
Stubs without those markers (protoc 3.21 with grpc_python_plugin 1.51, Debian 12's) need
protobuf's ``internal.builder`` (protobuf 3.20 and later) and grpcio 1.51 (the oldest runtime
this client is tested with).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = Path(__file__).resolve().parent
PROTO_NAME = "dmhnsw.proto"
PACKAGE_DIR = Path("dmhnsw") / "_proto"  # where the stubs live inside the package
GENERATED = ("dmhnsw_pb2.py", "dmhnsw_pb2.pyi", "dmhnsw_pb2_grpc.py")
NUMPY_REQUIREMENT = "numpy>=1.22"
GRPC_TOOLS_MIN = (1, 49)  # the first grpcio-tools with --pyi_out
# Floors of stubs that do not state them (see the module docstring).
UNMARKED_PROTOBUF_MIN = "3.20"
UNMARKED_GRPC_MIN = "1.51"


def find_proto() -> Path:
    """Path of dmhnsw.proto, or SystemExit naming every place that was looked at."""
    candidates = []
    env = os.environ.get("DMHNSW_PROTO")
    if env:
        candidates.append(Path(env))
    candidates.append(HERE.parent / "proto" / PROTO_NAME)
    candidates.append(HERE / "proto" / PROTO_NAME)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    looked = "\n".join(f"  - {p}" for p in candidates)
    raise SystemExit(
        "dmhnsw: cannot generate the gRPC stubs: the service definition "
        f"{PROTO_NAME} was not found. Looked at:\n{looked}\n"
        "Build from a checkout of the dmhnsw repository (pip install ./python from its root, "
        "so that ../proto/dmhnsw.proto exists next to python/), or set DMHNSW_PROTO to the "
        "path of dmhnsw.proto."
    )


def _version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _grpc_tools_usable() -> tuple:
    """``(usable, why)``: whether grpcio-tools is importable and new enough for --pyi_out."""
    try:
        from grpc_tools import protoc  # noqa: F401
    except ImportError as exc:
        return False, f"grpcio-tools is not importable ({exc})"
    try:
        from importlib.metadata import version

        found = version("grpcio-tools")
    except Exception:  # no metadata (an unusual install): let it try, fall back if it fails
        return True, "grpcio-tools of unknown version"
    if _version_tuple(found) < GRPC_TOOLS_MIN:
        want = ".".join(map(str, GRPC_TOOLS_MIN))
        return False, f"grpcio-tools {found} is older than {want} (no --pyi_out)"
    return True, f"grpcio-tools {found}"


def _system_tools() -> tuple:
    """``(protoc, grpc_python_plugin)`` paths, either None when not found."""
    protoc = os.environ.get("DMHNSW_PROTOC") or shutil.which("protoc")
    plugin = os.environ.get("DMHNSW_GRPC_PYTHON_PLUGIN") or shutil.which("grpc_python_plugin")
    if not plugin and protoc:
        beside = Path(protoc).resolve().parent / "grpc_python_plugin"
        if beside.is_file() and os.access(beside, os.X_OK):
            plugin = str(beside)
    return protoc, plugin


def _run_grpc_tools(tmp: str, staged: Path, out_root: Path) -> Optional[str]:
    """Runs grpc_tools.protoc; None when it succeeded, else why not."""
    from grpc_tools import protoc

    try:  # the well-known types (google/protobuf/*.proto) shipped with grpcio-tools
        from importlib.resources import files

        wkt_include = str(files("grpc_tools") / "_proto")
    except Exception:  # pragma: no cover - very old Python or unusual install
        wkt_include = str(Path(protoc.__file__).resolve().parent / "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={tmp}",
            f"--proto_path={wkt_include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(staged),
        ]
    )
    return None if status == 0 else f"grpc_tools.protoc exited {status}"


def _run_system_protoc(tmp: str, staged: Path, out_root: Path) -> Optional[str]:
    """Runs the system protoc with grpc_python_plugin; None when it succeeded, else why not."""
    protoc, plugin = _system_tools()
    if not protoc or not plugin:
        missing = [n for n, p in (("protoc", protoc), ("grpc_python_plugin", plugin)) if not p]
        return f"{' and '.join(missing)} not found (set DMHNSW_PROTOC / DMHNSW_GRPC_PYTHON_PLUGIN)"
    args = [
        protoc,
        f"--plugin=protoc-gen-grpc_python={plugin}",
        f"--proto_path={tmp}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(staged),
    ]
    try:
        result = subprocess.run(args, capture_output=True, text=True)
    except OSError as exc:
        return f"{protoc}: {exc}"
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        return f"{' '.join(args)} exited {result.returncode}: {output}"
    return None


def generate(out_root: Path) -> list[Path]:
    """Runs protoc on the .proto; the stubs land in out_root/dmhnsw/_proto/.

    grpcio-tools when usable, else (or when it fails, or when $DMHNSW_PROTOC is set) the
    system protoc with grpc_python_plugin; SystemExit saying what was tried when none works.
    """
    proto = find_proto()
    out_root = Path(out_root)
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    attempts = []
    if os.environ.get("DMHNSW_PROTOC"):
        routes = [("system protoc", _run_system_protoc)]
    else:
        usable, why = _grpc_tools_usable()
        routes = [("system protoc", _run_system_protoc)]
        if usable:
            routes.insert(0, (why, _run_grpc_tools))
        else:
            attempts.append(why)
    with tempfile.TemporaryDirectory(prefix="dmhnsw-proto-") as tmp:
        staged = Path(tmp) / PACKAGE_DIR / PROTO_NAME
        staged.parent.mkdir(parents=True)
        shutil.copyfile(proto, staged)
        for name, run in routes:
            error = run(tmp, staged, out_root)
            if error is None:
                print(f"dmhnsw: gRPC stubs generated by {name}", file=sys.stderr)
                break
            attempts.append(f"{name}: {error}")
            print(f"dmhnsw: {name} failed: {error}", file=sys.stderr)
        else:
            tried = "\n".join(f"  - {a}" for a in attempts)
            raise SystemExit(
                f"dmhnsw: cannot generate the gRPC stubs from {proto}:\n{tried}\n"
                "Install grpcio-tools >= 1.49 (pip does so in its ordinary isolated build), or the "
                "system protoc (>= 3.20) and grpc_python_plugin (Debian: protobuf-compiler "
                "protobuf-compiler-grpc)."
            )
    outputs = [out_root / PACKAGE_DIR / name for name in GENERATED]
    missing = [str(p) for p in outputs if not p.is_file()]
    if missing:
        raise SystemExit(f"dmhnsw: protoc did not produce {', '.join(missing)} from {proto}")
    return outputs


def runtime_requirements() -> list[str]:
    """grpcio / protobuf lower bounds read from freshly generated stubs, plus numpy."""
    grpc_min, protobuf_min = UNMARKED_GRPC_MIN, UNMARKED_PROTOBUF_MIN
    with tempfile.TemporaryDirectory(prefix="dmhnsw-stubs-") as tmp:
        pb2, _, pb2_grpc = generate(Path(tmp))
        match = re.search(
            r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
            r"\s*(\d+),\s*(\d+),\s*(\d+),",
            pb2.read_text(encoding="utf-8"),
        )
        if match:
            protobuf_min = ".".join(match.groups())
        match = re.search(
            r"^GRPC_GENERATED_VERSION = ['\"]([^'\"]+)['\"]",
            pb2_grpc.read_text(encoding="utf-8"),
            re.M,
        )
        if match:
            grpc_min = match.group(1)
    return [f"grpcio>={grpc_min}", f"protobuf>={protobuf_min}", NUMPY_REQUIREMENT]


class build_py(_build_py):
    """build_py that also generates the gRPC stubs."""

    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            # an in-tree build reuses python/build/: start the package from scratch so that a
            # module deleted from the source cannot linger in the next wheel
            shutil.rmtree(Path(self.build_lib) / "dmhnsw", ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            # pip install -e: the package is imported from the source tree (.gitignore'd files)
            generate(HERE)
        else:
            generate(Path(self.build_lib))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs += [str(Path(self.build_lib) / PACKAGE_DIR / n) for n in GENERATED]
        return outputs


class sdist(_sdist):
    """sdist that carries a copy of the .proto (as proto/dmhnsw.proto), so it builds alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / "proto" / PROTO_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(find_proto(), target)


def check_offline_build() -> None:
    """SystemExit naming the Debian packages, where an offline build would fail obscurely.

    The offline route (``--no-build-isolation --no-index``, no grpcio-tools) builds with what the
    venv sees: without ``wheel`` an older setuptools fails with "invalid command 'bdist_wheel'",
    and without grpcio, protobuf or numpy pip finds no distribution to satisfy them.
    """
    if _grpc_tools_usable()[0]:
        return  # pip's isolated build (or a venv with grpcio-tools): pip fetches what is missing
    missing = []
    for module, package in (("grpc", "python3-grpcio"), ("google.protobuf", "python3-protobuf"),
                            ("numpy", "python3-numpy")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if "bdist_wheel" in sys.argv:
        try:
            import wheel  # noqa: F401
        except ImportError:
            try:
                import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70 carries it)
            except ImportError:
                missing.append("python3-wheel")
    if missing:
        raise SystemExit(
            f"dmhnsw: this Python ({sys.executable}) lacks {', '.join(missing)} for an offline build. "
            f"Install them (apt-get install {' '.join(missing)}, or tools/install-deps.sh) and make the "
            "venv with --system-site-packages; or, with PyPI reachable, drop --no-build-isolation "
            "--no-index and let pip fetch them."
        )


check_offline_build()
setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": build_py, "sdist": sdist},
)
