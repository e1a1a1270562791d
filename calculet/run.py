"""``python -m calculet.run``: start calculet.

The OpenAI-compatible service is built in a later step (see the README). Until then this entry
point regenerates the derived documents and says where they are, rather than pretending to serve.
"""

from __future__ import annotations

import sys

from calculet import specgen


def main(argv: list[str] | None = None) -> int:
    code = specgen.main([])
    print(f"calculet: the inference service is not built yet; the specifications are in {specgen.SPECS_DIR}/index.md")
    return code


if __name__ == "__main__":
    sys.exit(main())
