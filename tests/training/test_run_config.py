"""RunConfig, the typed base of the RL and SFT configs (training/run_config.py)."""

from __future__ import annotations

import dataclasses


def test_the_rl_and_sft_configs_share_one_typed_documented_base():
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.run_config import RunConfig
    from agentgym_lightning.training.sft.config import SFTConfig

    assert issubclass(LightningRLConfig, RunConfig) and issubclass(SFTConfig, RunConfig)
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    assert {"model", "learning_rate", "use_peft", "eval_steps", "save_steps", "report_to"} <= shared
    for f in dataclasses.fields(RunConfig):
        assert f.metadata.get("help"), f"{f.name} has no help"
    # The RL config restates none of them: its shared fields are the base's own.
    rl = {f.name: f for f in dataclasses.fields(LightningRLConfig)}
    base = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert all(rl[name] is base[name] for name in shared)
    assert LightningRLConfig(max_steps=7).total_steps == 7
    assert SFTConfig(sources=["x"], max_steps=7, rounds=3).total_steps == 21


def test_a_saved_config_keeps_the_key_order_it_always_had_and_every_field():
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.sft.config import SFTConfig

    rl = list(LightningRLConfig().to_dict())
    assert rl[:12] == ["env", "env_kwargs", "model", "backend", "generator_url", "policy_kwargs", "init_from", "output_dir",
                       "max_steps", "tasks_per_step", "num_generations", "concurrency"]
    assert rl[-2:] == ["log_episodes", "progress"] and sorted(rl) == sorted(LightningRLConfig.field_names())
    sft = list(SFTConfig(sources=["x"]).to_dict())
    assert sft[:6] == ["sources", "min_reward", "top_k", "success_only", "agent_match", "retokenize"]
    assert sorted(sft) == sorted(SFTConfig.field_names())


def test_a_yaml_recipe_is_read_once_for_every_config_and_its_errors_name_the_file(tmp_path):
    import pytest

    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.run_config import RunConfig

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("env: lightning/GuessNumber-v0\nmax_steps: 3\nnot_an_option: 1\n")
    # read_yaml does not check options against a class (eval --config reads an SFT or RL recipe with it) ...
    assert RunConfig.read_yaml(recipe) == {"env": "lightning/GuessNumber-v0", "max_steps": 3, "not_an_option": 1}
    # ... from_yaml does, and overrides win over the file.
    with pytest.raises(ValueError, match="unknown config option.*not_an_option"):
        LightningRLConfig.from_yaml(recipe)
    recipe.write_text("env: lightning/GuessNumber-v0\nmax_steps: 3\n")
    assert LightningRLConfig.from_yaml(recipe, max_steps=5).max_steps == 5
    (tmp_path / "empty.yaml").write_text("")
    assert RunConfig.read_yaml(tmp_path / "empty.yaml") == {}
    (tmp_path / "list.yaml").write_text("- env\n")
    (tmp_path / "bad.yaml").write_text("env: [\n")
    for name, error, message in (
        ("absent.yaml", FileNotFoundError, "absent.yaml does not exist"),
        ("list.yaml", ValueError, "list.yaml must hold a mapping of option: value, not list"),
        ("bad.yaml", ValueError, "bad.yaml is not valid YAML"),
    ):
        with pytest.raises(error, match=message):
            RunConfig.read_yaml(tmp_path / name)
