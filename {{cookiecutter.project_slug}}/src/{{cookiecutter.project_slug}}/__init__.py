"""{{ cookiecutter.project_slug }}: device-agnostic PyTorch Lightning training."""

# Everything here runs on lightning-kit, the library pyproject.toml names. Without it (uninstalled, or the project
# installed with `pip install --no-deps`), one line says how to install it, instead of an ImportError from deep inside
# the project; with another library than the one named, one line says so (once, at start-up).
try:
    from lightning_kit.installation import check_installation
except ModuleNotFoundError:
    raise SystemExit(
        "error: lightning-kit, the library this project runs on, is not installed here (or is older than the one "
        'pyproject.toml names): pip install -e ".[dev]" in the project\'s folder installs it'
    ) from None

check_installation(__name__)

__version__ = "{{ cookiecutter.version }}"
