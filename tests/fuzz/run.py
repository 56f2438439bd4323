"""Command-line entry point that runs one harness of ``tests.fuzz.harnesses`` under atheris.

This module owns the process a fuzz run lives in (``atheris.Fuzz()`` never returns, so the
pytest test and ``scripts/fuzz.py`` start it as a subprocess)::

    python3 -m tests.fuzz.run NAME [CORPUS_DIR ...] [-libfuzzer_flag=value ...]
    python3 -m tests.fuzz.run NAME crash-file      # replay one input, print its traceback
    python3 -m tests.fuzz.run --list

The extra target ``_selftest`` raises ``IndexError`` on any input starting with ``FUZZ``; the
pytest test runs it to prove that a crash in a harness fails the run and leaves its input.

It instruments the protocol codecs, the coordinator's request checks and the harnesses for coverage, supplies the harness's
``-max_len`` unless given, and caps the address space (``RIFFLE_FUZZ_AS_LIMIT_MB``, default
4096) so an allocation driven by a length field fails as ``MemoryError``, which the
harness does not allow, instead of swapping the machine. libFuzzer's ``-rss_limit_mb`` and
``-timeout`` still catch slow growth and slow inputs.
"""

from __future__ import annotations

import os
import resource
import sys


def _cap_address_space() -> None:
    limit_mb = int(os.environ.get("RIFFLE_FUZZ_AS_LIMIT_MB", "4096"))
    if limit_mb > 0:
        limit = limit_mb << 20
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


SELFTEST = "_selftest"
SELFTEST_CRASH = b"FUZZ"


def _selftest(data: bytes) -> None:
    if data.startswith(SELFTEST_CRASH):
        raise IndexError("selftest: the planted crash")


def main(argv: list[str]) -> None:
    import atheris
    from loguru import logger

    logger.remove()  # a fuzz run executes thousands of inputs: the coordinator's info lines are noise here
    with atheris.instrument_imports(include=["riffle_actors.protocol", "riffle_actors.coordinator", "tests.fuzz"]):
        from tests.fuzz.harnesses import HARNESSES

    if len(argv) < 2 or argv[1] in ("-h", "--help", "--list"):
        print("harnesses:", " ".join(sorted(HARNESSES)))
        raise SystemExit(0 if len(argv) >= 2 else 2)
    name, flags = argv[1], argv[2:]
    if name == SELFTEST:
        fn, max_len = _selftest, 64
    elif name in HARNESSES:
        fn, max_len = HARNESSES[name].fn, HARNESSES[name].max_len
    else:
        raise SystemExit(f"unknown harness {name!r}; known: {', '.join(sorted(HARNESSES))}")
    if not any(flag.startswith("-max_len=") for flag in flags):
        flags.append(f"-max_len={max_len}")
    _cap_address_space()
    atheris.Setup([argv[0], *flags], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
