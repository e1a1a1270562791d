"""``python -m calculet.package``: build, sign, verify, inspect and pack model packages.

The command line over :mod:`calculet.packages` (§11 steps 1–2), for the people who
produce packages (build, sign, pack, keygen) and those who receive them (verify, inspect).
``verify`` runs exactly the checks a model load runs, so a package that verifies here loads
past step 2. Every failure prints ``error: ...`` naming the package and file, and exits 1.

The one path, for the bundled tiny model and for a model of one's own (#18)::

    python -m calculet.package keygen --out keys/ --name my-key
    python -m calculet.package tiny pkgs/tiny --key keys/my-key.key.pem      # the bundled model
    python -m calculet.package build my-model/ pkgs/mine --key keys/my-key.key.pem
    python -m calculet.package verify pkgs/tiny --trusted-root pkgs --keys keys/
    python -m calculet.run --config serve.yaml    # models: [{alias: tiny-random, package: pkgs/tiny}]
                                                   # trust: {trusted_roots: [pkgs], trusted_keys_dir: keys}

``tiny`` builds the bundled model — random weights (seeded), a byte-level BPE tokenizer trained
now from ``calculet/data/tokenizer/corpus.txt`` and a Jinja2 chat template — into a package
through the same ``build`` as any model. A model of one's own is a directory holding its files —
weights, ``tokenizer.json``, ``tokenizer_config.json`` (with ``chat_template``) — and a
``manifest.json`` with the ``calbin-package/v1`` fields (architecture, profiles, capabilities,
golden, memory; see ``tiny``'s for an example); ``build`` computes ``files`` and signs.

Other examples::

    python -m calculet.package build model-src/ pkgs/qwen3-b1 --field 'profiles=[1]'
    python -m calculet.package sign pkgs/qwen3-b1 --key keys/release-2026.key.pem
    python -m calculet.package verify pkgs/qwen3-b1 --config scheduler.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from calculet.packages import (
    DEFAULT_MAX_FILE_BYTES,
    build_package,
    generate_keypair,
    inspect_package,
    key_id_of,
    load_private_key,
    pack_archive,
    sign_package,
    verify_package,
)
from calculet.errors import CalculetError

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse with exit code 1 on usage errors, like every other failure of this tool."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"error: {message}\n")


class _UsageError(Exception):
    """A bad combination of arguments found after parsing."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the documentation generator)."""
    parser = _Parser(
        prog="python -m calculet.package",
        description="Build, sign, verify and inspect signed calculet model packages (§11).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)

    build = sub.add_parser("build", help="copy a source directory into a package and write "
                           "manifest.json")
    build.add_argument("src", type=Path, help="directory holding the package files")
    build.add_argument("out", type=Path, help="new (or empty) package directory")
    build.add_argument("--format", default=None, help="manifest format (default "
                       "calbin-package/v1)")
    build.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                       help="extra manifest field; VALUE is JSON if it parses, else a string "
                       "(repeatable)")
    build.add_argument("--fields-json", type=Path, metavar="FILE",
                       help="JSON object of extra manifest fields")
    build.add_argument("--key", type=Path, metavar="PRIVATE_KEY",
                       help="sign the new package with this private key")
    build.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES)

    sign = sub.add_parser("sign", help="sign a package's manifest.json (writes manifest.sig)")
    sign.add_argument("package", type=Path)
    sign.add_argument("--key", type=Path, required=True, metavar="PRIVATE_KEY",
                      help="Ed25519 private key (PEM, or 32-byte seed in hex)")

    verify = sub.add_parser("verify", help="run the load checks of §11 steps 1-2")
    verify.add_argument("package", type=Path, help="package directory or .tar archive")
    verify.add_argument("--trusted-root", action="append", type=Path, default=[],
                        metavar="DIR", help="directory packages must lie under (repeatable)")
    verify.add_argument("--keys", type=Path, metavar="DIR",
                        help="directory of trusted public keys")
    verify.add_argument("--config", type=Path, metavar="FILE",
                        help="take trusted roots, keys and size limit from a "
                        "calculet-scheduler/v1 config's trust section")
    verify.add_argument("--max-file-bytes", type=int, default=None)
    verify.add_argument("--json", action="store_true", help="print the result as JSON")

    inspect = sub.add_parser("inspect", help="show a package's manifest (NOT verified)")
    inspect.add_argument("package", type=Path)
    inspect.add_argument("--keys", type=Path, metavar="DIR",
                         help="also report which trusted key signed the manifest")
    inspect.add_argument("--json", action="store_true")

    keygen = sub.add_parser("keygen", help="generate an Ed25519 key pair")
    keygen.add_argument("--out", type=Path, required=True, metavar="DIR")
    keygen.add_argument("--name", required=True)

    tiny = sub.add_parser("tiny", help="build the bundled tiny model (random weights, trained BPE tokenizer, "
                          "chat template) as a package")
    tiny.add_argument("out", type=Path, help="new (or empty) package directory")
    tiny.add_argument("--key", type=Path, metavar="PRIVATE_KEY", help="sign the new package with this private key")

    pack = sub.add_parser("pack", help="write a package directory as a reproducible .tar")
    pack.add_argument("package", type=Path)
    pack.add_argument("archive", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 1 any failure)."""
    args = build_parser().parse_args(argv)
    try:
        handler = _HANDLERS[args.command]
        handler(args)
    except (CalculetError, _UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 1
    return 0


def _parse_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if args.fields_json is not None:
        try:
            loaded = json.loads(args.fields_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _UsageError(f"--fields-json {args.fields_json}: {exc}") from None
        if not isinstance(loaded, dict):
            raise _UsageError(f"--fields-json {args.fields_json}: must hold a JSON object")
        fields.update(loaded)
    for item in args.field:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise _UsageError(f"--field {item!r}: expected KEY=VALUE")
        try:
            fields[key] = json.loads(raw)
        except ValueError:
            fields[key] = raw
    if args.format is not None:
        fields["format"] = args.format
    return fields


def _cmd_build(args: argparse.Namespace) -> None:
    fields = _parse_fields(args)
    if args.key is not None:
        load_private_key(args.key)  # fail before copying gigabytes if the key is unusable
    package = build_package(args.src, args.out, fields, max_file_bytes=args.max_file_bytes)
    print(f"built {package}")
    if args.key is not None:
        _sign_and_report(package, args.key)


def _cmd_tiny(args: argparse.Namespace) -> None:
    import tempfile

    from calculet.adapters.sim.bundled import BUNDLED_ALIAS, build_bundled

    if args.key is not None:
        load_private_key(args.key)
    with tempfile.TemporaryDirectory(prefix="calculet-tiny-") as tmp:
        manifest = build_bundled(Path(tmp) / "src")
        package = build_package(Path(tmp) / "src", args.out)
    print(f"built {package} ({manifest.name}: random weights, a {manifest.architecture.vocab_size}-token BPE "
          f"tokenizer and its chat template; serve it as alias {BUNDLED_ALIAS!r})")
    if args.key is not None:
        _sign_and_report(package, args.key)


def _cmd_sign(args: argparse.Namespace) -> None:
    _sign_and_report(args.package, args.key)


def _sign_and_report(package: Path, key: Path) -> None:
    signature = sign_package(package, key)
    key_id = key_id_of(load_private_key(key).public_key())
    print(f"signed {signature} with {key_id}")


def _cmd_verify(args: argparse.Namespace) -> None:
    roots: list[Path] = list(args.trusted_root)
    keys_dir: Path | None = args.keys
    max_file_bytes: int | None = args.max_file_bytes
    if args.config is not None:
        from calculet.config import load_config

        trust = load_config(args.config).trust
        roots.extend(trust.trusted_roots)
        keys_dir = keys_dir if keys_dir is not None else trust.trusted_keys_dir
        max_file_bytes = max_file_bytes if max_file_bytes is not None else trust.max_file_bytes
    if not roots:
        raise _UsageError("give --trusted-root DIR (or --config with trust.trusted_roots)")
    if keys_dir is None:
        raise _UsageError("give --keys DIR (or --config with trust.trusted_keys_dir)")
    with verify_package(
        args.package,
        roots,
        keys_dir,
        max_file_bytes if max_file_bytes is not None else DEFAULT_MAX_FILE_BYTES,
    ) as verified:
        summary = {
            "package": str(verified.source),
            "format": verified.format,
            "manifest_sha256": verified.manifest_sha256,
            "key_id": verified.key_id,
            "key_name": verified.key_name,
            "files": len(verified.files),
            "total_bytes": verified.total_bytes,
        }
    if args.json:
        print(json.dumps({"ok": True, **summary}, indent=2))
        return
    print(f"OK {summary['package']}")
    for key in ("format", "manifest_sha256", "files", "total_bytes"):
        print(f"  {key}: {summary[key]}")
    print(f"  signed by: {verified.key_id} ({verified.key_name})")


def _cmd_inspect(args: argparse.Namespace) -> None:
    info = inspect_package(args.package, args.keys)
    manifest = info.manifest_dict()
    if args.json:
        print(json.dumps({
            "verified": False,
            "path": str(info.path),
            "archive": info.is_archive,
            "manifest_sha256": info.manifest_sha256,
            "signature_present": info.signature_present,
            "signed_by_trusted_key": info.signed_by,
            "manifest": manifest,
        }, indent=2, sort_keys=True))
        return
    files: Mapping[str, Mapping[str, Any]] = manifest["files"]
    print(f"{info.path}  (NOT verified: inspect reads the manifest only)")
    print(f"  format: {manifest['format']}")
    print(f"  manifest_sha256: {info.manifest_sha256}")
    signed = "no signature"
    if info.signature_present:
        signed = "signature present"
        if args.keys is not None:
            signed += (f", matches trusted key {info.signed_by}" if info.signed_by
                       else ", matches NO trusted key")
    print(f"  signature: {signed}")
    for key in sorted(k for k in manifest if k not in ("format", "files")):
        print(f"  {key}: {json.dumps(manifest[key], sort_keys=True)}")
    total = sum(int(entry.get("size", 0)) for entry in files.values())
    print(f"  files ({len(files)}, {total} bytes):")
    for rel in sorted(files):
        entry = files[rel]
        print(f"    {rel}  {entry.get('size')}  sha256:{entry.get('sha256')}")


def _cmd_keygen(args: argparse.Namespace) -> None:
    pair = generate_keypair(args.out, args.name)
    print(f"key id: {pair.key_id}")
    print(f"private key: {pair.private_key_path}  (keep secret; mode 0600)")
    print(f"public key:  {pair.public_key_path}  (copy into a trusted keys directory)")


def _cmd_pack(args: argparse.Namespace) -> None:
    archive = pack_archive(args.package, args.archive)
    print(f"packed {archive}")


_HANDLERS = {
    "build": _cmd_build,
    "sign": _cmd_sign,
    "verify": _cmd_verify,
    "inspect": _cmd_inspect,
    "keygen": _cmd_keygen,
    "pack": _cmd_pack,
    "tiny": _cmd_tiny,
}


if __name__ == "__main__":
    sys.exit(main())
