# SPDX-License-Identifier: Apache-2.0
# Written for this project (afd-ascend-ops).
"""Syntax-check the torch binding of the compiled Ascend kernels on a machine without CANN.

The binding (``csrc/binding/afd_ascend_npu.cpp``) needs torch's headers and torch-npu's
(ACL, HCCL and op-plugin's ``op_api_common.h`` ship inside the torch-npu wheel), but no CANN
toolkit: it includes no generated ``aclnn_*.h`` (``EXEC_NPU_CMD`` finds ``aclnnA2e`` /
``aclnnE2a`` by name at run time). So this script

1. downloads the torch-npu wheel of the installed torch's version into a cache directory
   (``python -m pip download --no-deps``; it never installs it: installing torch-npu
   without CANN breaks ``import torch``),
2. unzips only its ``torch_npu/include/`` tree next to it,
3. runs ``g++ -std=c++17 -fsyntax-only`` on the binding with torch's, torch-npu's and
   Python's include directories (as system headers: their warnings are not ours) and
   ``-Wall -Wextra -Werror`` for our code, prints the command and exits with g++'s status.

Nothing is compiled into an object and the kernels (AscendC) are not checked: they need
the CANN toolkit. Standard library only; run it with the interpreter of an environment
that has torch::

    python packages/afd-ascend-ops/tools/check_binding_syntax.py
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

#: The package's C++ sources.
CSRC = Path(__file__).resolve().parents[1] / "csrc"
#: What is checked unless --source says otherwise.
DEFAULT_SOURCES = (CSRC / "binding" / "afd_ascend_npu.cpp",)
#: The part of the wheel that is unpacked.
INCLUDE_PREFIX = "torch_npu/include/"
#: Include directories inside ``torch_npu/include`` the binding's headers need.
NPU_INCLUDE_DIRS = ("", "third_party/acl/inc", "third_party/hccl/inc", "third_party/op-plugin")
#: Marks a completely unpacked include tree.
UNPACKED = ".unpacked"


class CheckError(Exception):
    """A step before the compiler failed; the message says what to do."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/afd-ascend-ops`` (``~/.cache/afd-ascend-ops``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "afd-ascend-ops"


def torch_facts() -> tuple[str, list[str], int]:
    """The installed torch's version (without a local suffix such as ``+cpu``), its include
    directories and its C++ ABI flag."""
    try:
        import torch
        from torch.utils.cpp_extension import include_paths
    except ImportError as exc:
        raise CheckError(
            f"torch is not importable by {sys.executable} ({exc}); run this script with the "
            "interpreter of an environment that has torch (e.g. /work/venv/bin/python)"
        ) from None
    version = torch.__version__.split("+", 1)[0]
    return version, include_paths(), int(torch._C._GLIBCXX_USE_CXX11_ABI)


def download_wheel(version: str, wheels: Path) -> Path:
    """The cached torch-npu wheel of ``version``, downloaded first if missing."""
    found = sorted(wheels.glob(f"torch_npu-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        f"torch-npu=={version}", "--dest", str(wheels),
    ]  # fmt: skip
    print("+", shlex.join(command), flush=True)
    if subprocess.run(command, check=False).returncode != 0:
        raise CheckError(
            f"pip could not download torch-npu=={version} (see above): check that PyPI is "
            "reachable, or pass --torch-npu-version with a version that has a wheel for this "
            "platform and Python"
        )
    found = sorted(wheels.glob(f"torch_npu-{version}-*.whl"))
    if not found:
        raise CheckError(f"pip reported success but left no torch_npu-{version}-*.whl in {wheels}")
    return found[0]


def unpack_includes(wheel: Path, target: Path) -> Path:
    """Unzip only ``torch_npu/include/**`` of ``wheel`` under ``target``; returns the
    include root. Skipped when a previous run completed it."""
    root = target / INCLUDE_PREFIX
    if (target / UNPACKED).exists():
        return root
    if target.exists():
        shutil.rmtree(target)  # an interrupted earlier run
    target.mkdir(parents=True)
    base = target.resolve()
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith(INCLUDE_PREFIX)]
        if not members:
            raise CheckError(
                f"{wheel.name} has no {INCLUDE_PREFIX}: this torch-npu ships no headers"
            )
        for member in members:
            if not (base / member).resolve().is_relative_to(base):
                raise CheckError(f"{wheel.name} holds a path outside its tree: {member!r}")
            archive.extract(member, target)
    (target / UNPACKED).touch()
    return root


def compiler_command(
    cxx: str, sources: list[Path], npu_root: Path, torch_includes: list[str], abi: int, version: str
) -> list[str]:
    """The ``g++ -fsyntax-only`` command line for ``sources``."""
    major, minor = version.split(".")[:2]
    release = f"V2R{minor}"  # op-plugin's name of this torch release (its Version.h)
    version_header = npu_root / "third_party/op-plugin/op_plugin/utils/Version.h"
    if major != "2" or f"#define {release} " not in version_header.read_text():
        raise CheckError(
            f"torch {version}: op-plugin's {version_header.name} defines no {release}; use the "
            "torch-npu headers of this torch's release (--torch-npu-version)"
        )
    python_include = sysconfig.get_paths()["include"]
    if not (Path(python_include) / "Python.h").exists():
        raise CheckError(
            f"no Python.h in {python_include}: install this Python's development headers"
        )
    system = [*torch_includes, python_include, *(str(npu_root / d) for d in NPU_INCLUDE_DIRS)]
    return [
        cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DCURRENT_VERSION={release}",  # what torch-npu's own build defines
        # The binding's own headers and the shared ones (included flat, as the kernel build
        # lays them out), so that a copy of the binding elsewhere (--source) finds them.
        f"-I{CSRC / 'binding'}",
        f"-I{CSRC / 'common'}",
        *(f"-isystem{path}" for path in system),
        *(str(source) for source in sources),
    ]  # fmt: skip


def disk_usage(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=default_cache_dir(),
        help="where the wheel and its unpacked headers are kept (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--torch-npu-version",
        help="torch-npu version whose headers to use (default: the installed torch's version)",
    )
    parser.add_argument(
        "--source", type=Path, action="append",
        help="a C++ file to check instead of the binding (repeatable)",
    )  # fmt: skip
    parser.add_argument("--cxx", default="g++", help="the C++ compiler (default: %(default)s)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        torch_version, torch_includes, abi = torch_facts()
        version = args.torch_npu_version or torch_version
        if shutil.which(args.cxx) is None:
            raise CheckError(f"{args.cxx} is not on PATH: install g++ (apt-get install g++)")
        sources = args.source or list(DEFAULT_SOURCES)
        missing = [str(s) for s in sources if not s.is_file()]
        if missing:
            raise CheckError(f"no such source file: {', '.join(missing)}")
        wheel = download_wheel(version, args.cache_dir / "wheels")
        npu_root = unpack_includes(wheel, args.cache_dir / f"torch-npu-{version}")
        command = compiler_command(args.cxx, sources, npu_root, torch_includes, abi, torch_version)
    except CheckError as exc:
        print(f"check_binding_syntax: {exc}", file=sys.stderr)
        return 2
    print("+", shlex.join(command), flush=True)
    status = subprocess.run(command, check=False).returncode
    elapsed = time.monotonic() - started
    cache = disk_usage(args.cache_dir) / 2**20
    if status == 0:
        print(f"check_binding_syntax: OK in {elapsed:.0f} s ({cache:.0f} MiB in {args.cache_dir})")
    else:
        print(
            f"check_binding_syntax: {args.cxx} rejected the source (status {status}) after "
            f"{elapsed:.0f} s; fix the errors above. A header it cannot find means the torch-npu "
            f"wheel's layout changed: look under {npu_root}",
            file=sys.stderr,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
