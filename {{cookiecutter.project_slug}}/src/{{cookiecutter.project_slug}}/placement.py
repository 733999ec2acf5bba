"""The device audit: ``python -m {{ cookiecutter.project_slug }}.placement``.

Trains what ``train.py`` builds from the same arguments on a simulated CUDA GPU, and names the line
that would fail on a real one (docs/device-placement.md). lightning_kit's command, run with this
project's command line (``cli.ProjectCLI``): ``--help`` lists its options.
"""

from lightning_kit.placement import main

from .cli import ProjectCLI

if __name__ == "__main__":
    main(cli_class=ProjectCLI)
