"""The UPSTREAM Uniffle protocol (``Rss.proto`` from the released client jar), compiled for tests.

``load_upstream_proto()`` returns ``(pb2, pb2_grpc)`` generated from the ``Rss.proto`` that
ships at the root of ``org.apache.uniffle:rss-client-spark3-shaded:0.9.2`` — the contract the
real Java client was built from, so a test client made from it talks to our servers exactly as
the stock client does (field numbers, package ``rss.common``, method paths).

How:

1. the jar is taken from ``~/.m2`` or fetched with ``mvn ... dependency:copy`` (the version
   Maven Central serves here; 0.10.0 is not served);
2. ``Rss.proto`` is extracted into ``<repo>/.cache/upstream-proto/<version>/`` (git-ignored);
3. it is compiled with ``grpc_tools.protoc`` into a fresh temp directory and imported as the
   modules ``upstream_rss_pb2`` / ``upstream_rss_pb2_grpc``.

The generated message types are registered in a PRIVATE descriptor pool, not the default one:
our own ``uniffle_pb2`` already defines ``rss.common.*`` there, and protobuf refuses a second
definition of the same full names in one pool. The wire format does not care which pool a
message class came from.

The result is cached per process (``functools.cache``). When neither the jar nor Maven is
available the caller's test is skipped with the reason (``pytest.skip``).
Nothing here is committed output: the generated code lives only in temp/cache directories.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

UNIFFLE_VERSION = "0.9.2"
ARTIFACT = f"org.apache.uniffle:rss-client-spark3-shaded:{UNIFFLE_VERSION}:jar"
JAR_NAME = f"rss-client-spark3-shaded-{UNIFFLE_VERSION}.jar"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "upstream-proto" / UNIFFLE_VERSION
M2_JAR = Path.home() / ".m2/repository/org/apache/uniffle/rss-client-spark3-shaded" / UNIFFLE_VERSION / JAR_NAME

_POOL_PATCH = """\
from google.protobuf import empty_pb2 as _up_empty, wrappers_pb2 as _up_wrappers
_UPSTREAM_POOL = _descriptor_pool.DescriptorPool()
_UPSTREAM_POOL.AddSerializedFile(_up_empty.DESCRIPTOR.serialized_pb)
_UPSTREAM_POOL.AddSerializedFile(_up_wrappers.DESCRIPTOR.serialized_pb)
DESCRIPTOR = _UPSTREAM_POOL.AddSerializedFile("""


class UpstreamProtoUnavailable(RuntimeError):
    """The upstream jar could not be found or fetched."""


def _find_or_fetch_jar() -> Path:
    cached = CACHE_DIR / JAR_NAME
    for candidate in (M2_JAR, cached):
        if candidate.is_file():
            return candidate
    mvn = shutil.which("mvn")
    if mvn is None:
        raise UpstreamProtoUnavailable(f"{JAR_NAME} is not in ~/.m2 and mvn is not installed")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn, "-B", "-q",
        "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
        f"-Dartifact={ARTIFACT}",
        f"-DoutputDirectory={CACHE_DIR}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise UpstreamProtoUnavailable(f"mvn could not fetch {ARTIFACT} within 600s") from None
    if proc.returncode != 0 or not cached.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise UpstreamProtoUnavailable(f"mvn could not fetch {ARTIFACT}: {' | '.join(tail)}")
    return cached


def upstream_proto_path() -> Path:
    """``Rss.proto`` extracted from the upstream client jar (cached under ``.cache/upstream-proto``)."""
    target = CACHE_DIR / "Rss.proto"
    if target.is_file():
        return target
    jar = _find_or_fetch_jar()
    with zipfile.ZipFile(jar) as zf:
        try:
            data = zf.read("Rss.proto")
        except KeyError:
            raise UpstreamProtoUnavailable(f"{jar} has no Rss.proto at its root") from None
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def _import_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def _compile() -> tuple[ModuleType, ModuleType]:
    from grpc_tools import protoc

    proto = upstream_proto_path()
    out = Path(tempfile.mkdtemp(prefix="upstream-proto-"))
    try:
        src = out / "upstream_rss.proto"
        shutil.copyfile(proto, src)
        well_known = Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(
            ["protoc", f"-I{out}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}", str(src)]
        )
        if rc != 0:
            raise UpstreamProtoUnavailable(f"grpc_tools.protoc failed on {proto} (exit {rc})")
        pb2_path = out / "upstream_rss_pb2.py"
        code = pb2_path.read_text()
        marker = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
        if code.count(marker) != 1:
            raise UpstreamProtoUnavailable("unexpected protoc output: cannot move it to a private descriptor pool")
        pb2_path.write_text(code.replace(marker, _POOL_PATCH))
        pb2 = _import_file("upstream_rss_pb2", pb2_path)
        pb2_grpc = _import_file("upstream_rss_pb2_grpc", out / "upstream_rss_pb2_grpc.py")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return pb2, pb2_grpc


def load_upstream_proto() -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` of the upstream ``Rss.proto``; skips the calling test when unavailable."""
    try:
        return _compile()
    except UpstreamProtoUnavailable as e:
        pytest.skip(f"upstream Uniffle proto unavailable: {e}")
