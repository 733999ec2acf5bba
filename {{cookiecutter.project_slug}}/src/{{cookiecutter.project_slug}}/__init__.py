"""{{ cookiecutter.project_slug }}: device-agnostic PyTorch Lightning training."""

__version__ = "{{ cookiecutter.version }}"
