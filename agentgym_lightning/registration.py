"""Env ids: registers the ``lightning/...`` ones with Gymnasium (on ``import agentgym_lightning``),
reads what a user names (:func:`resolve_env_id`) and makes envs from it (:func:`make_env_factory`).

Gymnasium 1.x has no entry-point env plugins, so environments come through the
``agentgym_register_envs`` hook: the bundled env packages' own plugins (``envs/<name>/plugin.py``,
see :mod:`agentgym_lightning.plugin_manager`) and third-party ones alike. Only the core's own demo
env is named here. An env of one's own needs none of that: ``module:Id`` (Gymnasium's form:
``module`` registers ``Id`` when imported) and ``path/to/file.py:make_env`` (a function returning an
``AgentEnv``) work wherever an env id does. So do the shared environment formats, named by a
prefix (:data:`ENV_FORMATS`): ``verifiers:MODULE`` (a verifiers environment) and ``openenv:URL``
(an OpenEnv server), each made by the id its env package registers, with the target as a kwarg.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.envs.registration import WrapperSpec

if TYPE_CHECKING:
    from agentgym_lightning.env import AgentEnv

__all__ = [
    "BUNDLED_ENVS", "ENV_FORMATS", "TIME_LIMIT_AS_MAX_TURNS", "EnvKwargsError", "env_format", "register_envs", "lightning_env_ids", "resolve_env_id",
    "make_env_factory", "env_kwargs_refused", "is_file_factory", "file_factory",
]

#: The environments the core registers itself: id -> entry point (the env packages under
#: ``envs/`` register theirs through their plugins).
BUNDLED_ENVS: dict[str, str] = {
    "lightning/GuessNumber-v0": "agentgym_lightning.envs.guess_number:make_env",
}

#: Environments of a shared format, named ``<prefix>:<target>``: prefix -> (the env id that runs
#: them, registered by its env package's plugin; the keyword argument ``target`` is given as).
ENV_FORMATS: dict[str, tuple[str, str]] = {
    "verifiers": ("lightning/Verifiers-v0", "environment"),
    "openenv": ("lightning/OpenEnv-v0", "server"),
}

#: Applied by ``gym.make`` after its ``TimeLimit``: ``max_episode_steps=N`` ends agent episodes
#: at step N with the trajectory in ``info`` (see :class:`agentgym_lightning.env.TimeLimitAsMaxTurns`).
TIME_LIMIT_AS_MAX_TURNS = WrapperSpec(
    name="TimeLimitAsMaxTurns", entry_point="agentgym_lightning.env:TimeLimitAsMaxTurns", kwargs={}
)

_done = False
#: Ids that plugins registered through ``agentgym_register_envs``.
_plugin_env_ids: set[str] = set()


def register_envs() -> None:
    """Register bundled and plugin environments once (idempotent)."""
    global _done
    if _done:
        return
    _done = True
    for env_id, entry_point in BUNDLED_ENVS.items():
        if env_id not in gym.registry:
            # Agents end themselves; the env enforces max_turns and time limits, so no TimeLimit
            # by default. One asked for (max_episode_steps=N) becomes max_turns=N.
            gym.register(
                id=env_id, entry_point=entry_point, disable_env_checker=False, additional_wrappers=(TIME_LIMIT_AS_MAX_TURNS,)
            )
    from agentgym_lightning.plugin_manager import get_plugin_manager

    for specs in get_plugin_manager().hook.agentgym_register_envs():
        for spec in specs or []:
            spec = dict(spec)
            _plugin_env_ids.add(spec["id"])
            spec.setdefault("additional_wrappers", (TIME_LIMIT_AS_MAX_TURNS,))
            if spec["id"] not in gym.registry:
                gym.register(**spec)


def lightning_env_ids() -> list[str]:
    """Every registered id in the ``lightning`` namespace and those added by plugins."""
    register_envs()
    return sorted(k for k, v in gym.registry.items() if v.namespace == "lightning" or k in _plugin_env_ids)


def resolve_env_id(env: str) -> str:
    """The env id a user named: accepts ``GuessNumber-v0`` for ``lightning/GuessNumber-v0``,
    Gymnasium's ``module:Id`` and ``path/to/file.py:make_env`` (checked here: the module imports
    and registers ``Id``, the file has the function). Raises ``ValueError`` for an unknown id,
    listing the known ones and saying how to use one's own."""
    register_envs()
    if env in gym.registry:
        return env
    if f"lightning/{env}" in gym.registry:
        return f"lightning/{env}"
    if is_file_factory(env):
        file_factory(env)
        return env
    made_as = env_format(env)
    if made_as is not None:
        if made_as[0] not in gym.registry:
            raise ValueError(f"--env {env}: {made_as[0]}, which runs it, is not registered (is agentgym-lightning installed whole?)")
        return env
    module, sep, env_id = env.partition(":")
    if sep:
        if os.getcwd() not in sys.path:  # as `python -m` does: a module beside you imports
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"--env {env}: cannot import {module!r} ({exc})") from None
        if env_id not in gym.registry:
            raise ValueError(f"--env {env}: importing {module!r} did not register {env_id!r} (it must call gymnasium.register)")
        return env
    known = ", ".join(lightning_env_ids()) or "none"
    raise ValueError(
        f"unknown environment {env!r} (registered: {known}); for an env of your own, pass --env my_module:{env} "
        "(a module that calls gymnasium.register on import) or --env path/to/file.py:make_env (a function "
        "returning an AgentEnv), or register it from a plugin's agentgym_register_envs hook; a verifiers "
        "environment is --env verifiers:MODULE, an OpenEnv server --env openenv:URL"
    )


def make_env_factory(env: str | Callable[[], AgentEnv], env_kwargs: Mapping[str, Any] | None = None) -> Callable[[], AgentEnv]:
    """A zero-argument factory from an env id (``gym.make``: a registered id or Gymnasium's
    ``module:Id``), a ``path/to/file.py:make_env`` string (that function, called with
    ``env_kwargs``), or a factory."""
    if isinstance(env, str):
        from agentgym_lightning.env import AgentEnv

        register_envs()
        kwargs = dict(env_kwargs or {})

        def factory() -> AgentEnv:
            made_as = env_format(env)
            if is_file_factory(env):
                made = file_factory(env)(**kwargs)
            elif made_as is not None:
                made = gym.make(made_as[0], **made_as[1], **kwargs)
            else:
                made = gym.make(env, **kwargs)
            if not isinstance(made.unwrapped, AgentEnv):
                raise TypeError(f"{env} is not an agentgym-lightning AgentEnv")
            return made.unwrapped

        return factory
    if env_kwargs:
        raise ValueError("env_kwargs only apply to an env id; bake them into your factory instead")
    return env


class EnvKwargsError(ValueError):
    """An env id's creator refused the kwargs it was built with (a misspelt option, a bad value):
    ``"<env> does not accept <kwargs>: <the creator's error>"``."""

    def __init__(self, env: str, kwargs: Mapping[str, Any], error: BaseException) -> None:
        message = str(error).split(" was raised from the environment creator")[0]  # gymnasium's wrapping
        super().__init__(f"{env} {f'does not accept {dict(kwargs)}' if kwargs else 'could not be built'}: {message}")
        self.env, self.kwargs = env, dict(kwargs)


@contextlib.contextmanager
def env_kwargs_refused(env: str, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Around building ``env`` with ``kwargs``: what its creator raises for them (``TypeError``,
    ``ValueError``, a Gymnasium error) is raised as an :class:`EnvKwargsError` (from it)."""
    try:
        yield
    except EnvKwargsError:
        raise
    except (TypeError, ValueError, gym.error.Error) as exc:
        raise EnvKwargsError(env, kwargs, exc) from exc


def env_format(env: str) -> tuple[str, dict[str, str]] | None:
    """For ``"<prefix>:<target>"`` of a format in :data:`ENV_FORMATS` (``verifiers:my_env``), the
    env id that runs it and its kwargs (``{"environment": "my_env"}``); ``None`` for anything else."""
    prefix, sep, target = env.partition(":")
    if not sep or not target or prefix not in ENV_FORMATS:
        return None
    env_id, keyword = ENV_FORMATS[prefix]
    return env_id, {keyword: target}


def is_file_factory(env: str) -> bool:
    """Whether ``env`` names a factory in a Python file: ``path/to/file.py:make_env``."""
    path, sep, name = env.rpartition(":")
    return bool(sep) and path.endswith(".py") and name.isidentifier()


def file_factory(env: str, option: str = "--env ", kind: str = "a function returning an AgentEnv") -> Callable[..., Any]:
    """The function ``name`` of the file in ``"path/to/file.py:name"`` (the file is imported once
    per process): called with the env kwargs, it must return an ``AgentEnv``. Raises
    ``ValueError`` saying what is missing, as ``option`` named it and what ``kind`` of function
    it must be (another file function, such as a verifier, says its own)."""
    path, _, name = env.rpartition(":")
    file = Path(path).resolve()
    module = _file_modules.get(file)
    if module is None:
        if not file.is_file():
            raise ValueError(f"{option}{env}: no such file {path}")
        spec = importlib.util.spec_from_file_location(f"agentgym_env_file_{len(_file_modules)}_{file.stem}", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _file_modules[file] = module
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{option}{env}: {path} has no function {name!r} ({kind})")
    return factory


_file_modules: dict[Path, Any] = {}
