"""``promtool``, Prometheus' own checker, for the metrics, alert-rule and dashboard tests (issue #19).

``make system-tools`` installs it (Debian package ``prometheus``). Without it the tests that need
it fail under ``CI=true`` and are skipped elsewhere, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def promtool() -> str:
    """The promtool executable, or fail (CI) / skip (elsewhere)."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is not installed: run `make system-tools` (Debian package prometheus)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool args...`` from the repository root; stdout and stderr captured as text."""
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)


_METRIC = re.compile(r"(?<![A-Za-z0-9_:\"'])((?:calculet|process|python)_[A-Za-z0-9_]+)(?![A-Za-z0-9_(])")
_QUOTED = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (quoted label values and function names left out)."""
    return set(_METRIC.findall(_QUOTED.sub('""', expr)))


def scraped_sample_names(text: str) -> set[str]:
    """Every sample name of a text-format scrape (``_total``, ``_bucket``, ``_sum``, ``_count`` as exposed)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def check_promql(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` over one recording rule per expression: PromQL syntax as Prometheus parses it.

    Grafana's ``$__rate_interval`` and ``$instance`` are replaced by what Grafana would put there."""
    rules = [{"record": f"check:{name}", "expr": expr.replace("$__rate_interval", "5m").replace("$instance", ".*")}
             for name, expr in exprs.items()]
    path = tmp_path / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}, sort_keys=False))
    return run_promtool("check", "rules", str(path))
