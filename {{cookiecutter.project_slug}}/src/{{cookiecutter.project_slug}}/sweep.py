"""Sweeps and cross-validation: ``python -m {{ cookiecutter.project_slug }}.sweep``.

Optuna studies over ``train.py``'s own flags, each trial an ordinary run. lightning_kit's command,
run with this project's command line (``cli.ProjectCLI``): ``--help`` lists its options.
"""

from lightning_kit.sweep.command import main

from .cli import ProjectCLI

if __name__ == "__main__":
    main(cli_class=ProjectCLI)
