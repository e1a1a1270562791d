"""The deployment files, checked statically (``docker build`` and a cluster cannot run here): the
Dockerfile against hadolint-like rules chosen for this service, the systemd unit with
``systemd-analyze verify`` (and parsed), the Kubernetes manifests parsed with PyYAML — and each
file's paths, ports, commands and drain times matched against the service's own routes, CLI and
configuration (R3.5: one process per board; R12.1–R12.3: stop drains within the deadline)."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from calculet.cli import COMMANDS
from calculet.config import default_config, parse_config
from calculet.fleet.cli import build_parser as fleet_parser
from calculet.run import build_parser as run_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DEFAULT_DRAIN_S = default_config().executor.drain_deadline_ms / 1000


def health_routes() -> set[str]:
    """The health paths the app serves (read from the app factory's route decorators)."""
    return set(re.findall(r'@app\.get\("(/health[^"]*)"', (ROOT / "calculet/server/app.py").read_text()))


def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]  # type: ignore[no-any-return]


def check_calculet_command(argv: list[str]) -> None:
    """``argv`` (starting with ``calculet``) names a real subcommand and parses with its options."""
    assert argv[0] == "calculet" and argv[0] in console_scripts()
    assert argv[1] in COMMANDS, argv
    parser = {"serve": run_parser, "fleet": fleet_parser}[argv[1]]()
    parser.parse_args(argv[2:])  # exits (SystemExit) on an unknown option


# ---------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    rows = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            rows.append((word.upper(), rest.strip()))
    return rows


def final_stage() -> list[tuple[str, str]]:
    rows = dockerfile()
    last_from = max(i for i, (word, _) in enumerate(rows) if word == "FROM")
    return rows[last_from:]


def test_dockerfile_bases_are_pinned_slim_python_and_nothing_is_added_from_urls() -> None:
    rows = dockerfile()
    images = [args.split()[0] for word, args in rows if word == "FROM"]
    assert images and all(":" in image and not image.endswith(":latest") for image in images)  # DL3006/DL3007
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", final_stage()[0][1].split()[0])
    assert not [args for word, args in rows if word == "ADD"]  # DL3020: COPY for local files
    for word, args in rows:
        if word == "RUN":
            assert "sudo " not in args and not re.search(r"(^|&&|;)\s*cd ", args)  # DL3004, DL3003
            if "apt-get install" in args:
                assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists" in args  # DL3015/DL3009
            if "pip install" in args:
                assert "--no-cache-dir" in args  # DL3042
                assert ".[" not in args  # the image installs what serving needs, no test/bench extras
    for word, args in rows:
        if word == "COPY" and "--from=" not in args:
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"


def test_dockerfile_runs_the_service_as_a_non_root_user_with_a_health_check_on_its_port() -> None:
    stage = final_stage()
    users = [args for word, args in stage if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = json.loads(next(args for word, args in stage if word == "ENTRYPOINT"))  # exec form (DL3025)
    cmd = json.loads(next(args for word, args in stage if word == "CMD"))
    check_calculet_command(entry + cmd)
    port = cmd[cmd.index("--port") + 1]
    assert [args for word, args in stage if word == "EXPOSE"] == [port]
    check = next(args for word, args in stage if word == "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]+)", check)
    assert url is not None and url.group(1) == port and url.group(2) in health_routes()
    assert "CMD [" in check  # exec form
    assert ("STOPSIGNAL", "SIGTERM") in stage  # the drain signal (§12)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("**") + 1:][:3] == ["!pyproject.toml", "!README.md", "!calculet/**"]


# ---------------------------------------------------------------------------------------------
# systemd
# ---------------------------------------------------------------------------------------------

UNIT = DEPLOY / "systemd" / "calculet@.service"


def unit_sections() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


@pytest.mark.req("R3.5", "R12.3")
def test_the_unit_runs_one_board_per_instance_and_stops_and_reloads_by_draining() -> None:
    unit = unit_sections()["Service"]
    start = shlex.split(unit["ExecStart"])
    assert Path(start[0]).name == "calculet" and "/etc/calculet/%i.yaml" in start
    check_calculet_command(["calculet", *[a.replace("%i", "board0") for a in start[1:]]])
    reload = shlex.split(unit["ExecReload"])
    check_calculet_command(["calculet", *[a.replace("%i", "board0") for a in reload[1:]]])
    assert reload[1:3] == ["fleet", "reload"]
    pre = shlex.split(unit["ExecStartPre"])
    assert pre[1:3] == ["config", "check"] and pre[3] == "/etc/calculet/%i.yaml"
    assert unit["KillSignal"] == "SIGTERM" and unit["KillMode"] == "mixed" and unit["Restart"] == "on-failure"
    assert int(unit["TimeoutStopSec"]) > DEFAULT_DRAIN_S  # the drain deadline fits before SIGKILL
    assert unit["User"] != "root" and unit["NoNewPrivileges"] == "yes"


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed; the unit is still parsed by the test above")
    calculet = Path(sys.executable).with_name("calculet")
    assert calculet.exists(), "the calculet console script is not installed (pip install -e .)"
    text = UNIT.read_text().replace("/opt/calculet/bin/calculet", str(calculet))
    instance = tmp_path / "calculet@board0.service"
    instance.write_text(text)
    done = subprocess.run([analyze, "verify", "--man=no", str(instance)], capture_output=True, text=True,
                          timeout=60)
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if "calculet@" in line]
    assert done.returncode == 0 and complaints == [], done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------


def manifests() -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.setdefault(doc["kind"], []).append(doc)
    return found


@pytest.mark.req("R3.5", "R12.2", "R12.3")
def test_manifests_probe_the_service_routes_on_its_port_and_drain_before_the_grace_period() -> None:
    docs = manifests()
    (statefulset,) = docs["StatefulSet"]
    (configmap,) = docs["ConfigMap"]
    config = parse_config(yaml.safe_load(configmap["data"]["calculet.yaml"]))  # as `calculet config check` does
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.server.port}
    args = container["args"]
    run_parser().parse_args(args)
    assert args[args.index("--port") + 1] == str(config.server.port)
    assert args[args.index("--config") + 1] == "/etc/calculet/calculet.yaml"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/calculet"
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/health/ready" and probes["livenessProbe"]["path"] == "/health/live"
    assert all(p["path"] in health_routes() and p["port"] in ports for p in probes.values())
    drain_s = config.executor.drain_deadline_ms / 1000
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= drain_s
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    check_calculet_command(pre_stop)
    assert pre_stop[1:3] == ["fleet", "drain"] and float(pre_stop[pre_stop.index("--timeout") + 1]) < grace
    assert pre_stop[pre_stop.index("--alias") + 1] == config.model_alias
    assert f":{config.server.port}" in pre_stop[pre_stop.index("--url") + 1]


def test_manifests_name_the_board_as_a_placeholder_run_non_root_and_select_their_pods() -> None:
    docs = manifests()
    (statefulset,) = docs["StatefulSet"]
    pod = statefulset["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    devices = [k for k in container["resources"]["limits"] if "/" in k]
    assert devices == ["calculet.example/npu"] and container["resources"]["limits"][devices[0]] == 1
    assert "PLACEHOLDER" in (DEPLOY / "k8s" / "statefulset.yaml").read_text()
    context = pod["spec"]["securityContext"]
    docker_user = next(args for word, args in final_stage() if word == "USER").split(":")[0]
    assert context["runAsNonRoot"] is True and str(context["runAsUser"]) == docker_user
    labels = pod["metadata"]["labels"]
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for service in docs["Service"]:
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert container["image"] == f"calculet:{version}"
    assert statefulset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1  # one board at a time
