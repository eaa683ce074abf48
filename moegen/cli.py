"""The `moegen` command."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .build import build
from .ir import DimError, ParseError, VerifyError, parse
from .quant import QuantFormatError
from .spec import SpecError, load_spec

# Errors that are the user's input, not moegen's bug: one line, exit 2.
USER_ERRORS = (SpecError, ParseError, VerifyError, DimError, QuantFormatError, FileNotFoundError,
               IsADirectoryError)


class UsageError(Exception):
    """A command that cannot run as asked (bad option value, no GPU, ...)."""


def cmd_inspect(args) -> int:
    spec = load_spec(args.spec)
    module = build(spec)
    print(module, end="")
    return 0


def cmd_opt(args) -> int:
    path = Path(args.file)
    text = sys.stdin.read() if args.file == "-" else path.read_text()
    module = parse(text, source=str(path))
    module.verify()
    print(module, end="")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moegen",
        description="Compile W4A16 MoE and MSD matmul pipelines to CUDA and AscendC kernels.")
    p.add_argument("--version", action="version", version=f"moegen {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    s = sub.add_parser("inspect", help="print a spec's pipeline as IR",
                       description="Build the spec's pipeline, verify it and print its IR.")
    s.add_argument("spec", help="path to a spec.yaml")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("opt", help="parse, verify and print a .mir file",
                       description="Parse a module in moegen's textual IR, verify it, print it.")
    s.add_argument("file", help="a .mir file, or - for standard input")
    s.set_defaults(func=cmd_opt)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        text = str(exc) if not isinstance(exc, OSError) else f"{exc.filename}: {exc.strerror}"
        print(f"moegen: error: {text}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"moegen: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
