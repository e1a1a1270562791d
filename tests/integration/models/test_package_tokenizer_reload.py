"""A replacement generation must keep the running engine's tokenizer and chat template (#18, §11 step 3):
the engine serves every generation with the first one's, so another template is refused before
anything is created, while new weights under the same tokenizer load."""

from __future__ import annotations

from pathlib import Path

import pytest

from calculet.adapters.sim.build import build_package
from calculet.adapters.sim.model import TinyConfig
from calculet.packages import sign_package
from calculet.packages.tokenizer_files import bundled_tokenizer_files
from calculet.runtime.models.reports import LoadFailed, LoadStep
from tests.integration.models.support import ALIAS, ModelsEnv, make_rig


def bpe_package(env: ModelsEnv, name: str, *, seed: int | None = None, template: str | None = None) -> Path:
    files = bundled_tokenizer_files() if template is None else bundled_tokenizer_files(chat_template=template)
    config = None if seed is None else TinyConfig(vocab_size=files.vocab_size, bos=0, eos=1, pad=2, unk=3, seed=seed)
    path = env.root / name
    build_package(path, name=name, tokenizer=files, config=config)
    sign_package(path, env.signer.private_key_path)
    return path


def test_a_replacement_with_another_chat_template_is_refused(tmp_path: Path) -> None:
    env = ModelsEnv.create(tmp_path)
    first = bpe_package(env, "model-a")
    rig = make_rig(env.config(first))
    try:
        assert rig.driver.tokenizer.chat_text([("user", "hi")]).startswith("<|bos|><|user|>")
        other = bpe_package(env, "model-b", template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
                                                      "{% endfor %}")
        with pytest.raises(LoadFailed) as failed:
            rig.models.load(ALIAS, other)
        rig.driver.run_until_idle()
        assert failed.value.step is LoadStep.VALIDATE
        assert "tokenizer or chat template differs" in str(failed.value)
        same = bpe_package(env, "model-c", seed=7)
        assert rig.models.load(ALIAS, same).ok
        rig.driver.run_until_idle()
    finally:
        rig.driver.stop()
