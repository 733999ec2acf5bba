"""Every private name of another project the library relies on is still there, as the library uses it.

Run at the newest versions pinned and at the lowest declared: a release that renames one fails here, by name,
instead of silently turning off what it was for.
"""

import importlib
import inspect

import pytest
from packaging.version import Version

from lightning_kit.upstream import lightning as lightning_privates
from lightning_kit.upstream import litserve as litserve_privates
from lightning_kit.upstream import torch as torch_privates

PRIVATES = [
    *lightning_privates.PRIVATES,
    *torch_privates.PRIVATES,
    *litserve_privates.PRIVATES,
]
OVERRIDES = lightning_privates.OVERRIDES


@pytest.mark.parametrize("private", PRIVATES, ids=[private.name for private in PRIVATES])
def test_each_private_name_is_found_as_the_library_uses_it(private) -> None:
    assert isinstance(private.find(), private.kind), private.use
    assert private.versions.split()[0] in {"lightning", "litserve", "optuna", "torch", "uvicorn"}


@pytest.mark.parametrize("override", OVERRIDES, ids=[override.method for override in OVERRIDES])
def test_each_overridden_method_is_the_base_class_s_with_the_parameters_the_override_takes(override) -> None:
    from lightning_kit.cli import KitCLI

    module, _, name = override.owner.rpartition(".")
    owner = getattr(importlib.import_module(module), name)
    assert issubclass(KitCLI, owner)
    assert vars(KitCLI)[override.method], f"KitCLI no longer overrides {override.method}: drop it from the table"
    assert tuple(inspect.signature(getattr(KitCLI, override.method)).parameters) == override.parameters
    installed = Version(importlib.import_module("lightning").__version__)
    if override.since is not None and installed < Version(override.since):
        assert not hasattr(owner, override.method)  # nothing to override yet: the override is never called
        return
    assert tuple(inspect.signature(getattr(owner, override.method)).parameters) == override.parameters


def test_the_draining_server_class_leaves_litserve_as_it_is() -> None:
    """The server's HTTP servers are the draining class, LitServe's module and classes as they were: another
    LitServer in the process starts LitServe's own."""
    import litserve
    import litserve.server

    own, start = litserve.server._Server, litserve.LitServer._start_server
    draining = type("Draining", (litserve_privates.http_server_base(),), {})  # as stopping.Stopper makes it
    serving = litserve_privates.server_class(draining)
    assert issubclass(serving, litserve.LitServer) and serving._start_server.__globals__["_Server"] is draining
    assert serving._start_server.__code__ is start.__code__  # LitServe's own code, not a copy of it
    assert litserve.server._Server is own and litserve.LitServer._start_server is start
