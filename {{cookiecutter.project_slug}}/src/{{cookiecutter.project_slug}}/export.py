"""``python -m {{ cookiecutter.project_slug }}.export``: a checkpoint as one ``.pt2`` file (and ``.onnx``) that runs without the project.

lightning_kit's command, run with this project's command line (``cli.ProjectCLI``): ``--help`` lists its options.
"""

from lightning_kit.export import main

from .cli import ProjectCLI

if __name__ == "__main__":
    main(cli_class=ProjectCLI)
