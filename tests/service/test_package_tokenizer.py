"""Chat completions use the served package's own chat template and tokenizer (#18, §11): another
template in the package gives other prompt tokens; a tampered ``tokenizer.json`` never loads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from calculet.adapters.sim import SimConfig, TimeMode
from calculet.adapters.sim.build import build_package
from calculet.errors import PackageError
from calculet.packages import ensure_dev_keypair, sign_package, verify_package
from calculet.packages.tokenizer_files import bundled_tokenizer_files
from calculet.runtime.engine.types import EngineOptions
from calculet.server.bringup import bring_up
from tests.service.support import ALIAS, RunningServer, service_config, start_server

OTHER_TEMPLATE = ("{{ bos_token }}{% for m in messages %}### {{ m['role'] | upper }}: {{ m['content'] }}\n"
                  "{% endfor %}{% if add_generation_prompt %}### ASSISTANT:{% endif %}")
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is a KV lane?"}]


def package(root: Path, name: str, key_dir: Path, template: str | None = None) -> Path:
    files = bundled_tokenizer_files() if template is None else bundled_tokenizer_files(chat_template=template)
    path = root / name
    build_package(path, name=name, tokenizer=files)
    sign_package(path, ensure_dev_keypair(key_dir).private_key_path)
    return path


def config_for(root: Path, path: Path, key_dir: Path) -> object:
    keys = ensure_dev_keypair(key_dir).public_key_path.parent
    return service_config(models=[{"alias": ALIAS, "package": str(path)}],
                          trust={"trusted_roots": [str(root)], "trusted_keys_dir": str(keys)})


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory, key_dir: Path) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("template-packages")
    return root, package(root, "default-template", key_dir), package(root, "other-template", key_dir, OTHER_TEMPLATE)


@pytest.fixture
def served(request: pytest.FixtureRequest, packages: tuple[Path, Path, Path], key_dir: Path
           ) -> Iterator[RunningServer]:
    root, default, other = packages
    running = start_server(config_for(root, other if request.param == "other" else default, key_dir), key_dir)  # type: ignore[arg-type]
    yield running
    running.stop()


@pytest.mark.parametrize("served", ["default", "other"], indirect=True)
def test_chat_completions_apply_the_package_chat_template(served: RunningServer) -> None:
    """The prompt the engine sees is the package template's rendering, tokenised by the package."""
    tok = served.service.tokenizer
    expected = tok.encode_chat(tok.chat_text([(m["role"], m["content"]) for m in MESSAGES]))
    out = served.client("alpha").chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.prompt_tokens == len(expected)
    rendered = tok.chat_text([(m["role"], m["content"]) for m in MESSAGES])
    assert ("### SYSTEM: be brief" in rendered) == (served.brought.package.endswith("other-template"))


def test_a_different_template_changes_the_prompt_tokens(packages: tuple[Path, Path, Path], key_dir: Path) -> None:
    root, default, other = packages
    counts = []
    for path in (default, other):
        running = start_server(config_for(root, path, key_dir), key_dir)  # type: ignore[arg-type]
        try:
            out = running.client("alpha").chat.completions.create(model=ALIAS, messages=MESSAGES,  # type: ignore[arg-type]
                                                                  max_tokens=1)
            assert out.usage is not None
            counts.append(out.usage.prompt_tokens)
        finally:
            running.stop()
    assert counts[0] != counts[1]


def test_a_tampered_tokenizer_json_fails_the_signature_check(tmp_path: Path, key_dir: Path) -> None:
    """R11.2: tokenizer.json is listed in files, so the signed manifest covers it."""
    path = package(tmp_path, "tampered", key_dir)
    keys = ensure_dev_keypair(key_dir).public_key_path.parent
    verify_package(path, [tmp_path], keys)
    text = (path / "tokenizer.json").read_text()
    (path / "tokenizer.json").write_text(text.replace('"<|user|>"', '"<|usr|>"', 1))
    with pytest.raises(PackageError, match="tokenizer.json"):
        verify_package(path, [tmp_path], keys)
    with pytest.raises(PackageError, match="tokenizer.json"):
        bring_up(config_for(tmp_path, path, key_dir), sim=SimConfig(time_mode=TimeMode.REAL),  # type: ignore[arg-type]
                 options=EngineOptions(monitor_mode=None))
