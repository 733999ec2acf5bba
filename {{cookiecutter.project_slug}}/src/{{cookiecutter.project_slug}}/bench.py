"""``python -m {{ cookiecutter.project_slug }}.bench``: the training path against a hand-written loop: data, overhead, throughput.

lightning_kit's command, run with this project's command line (``cli.ProjectCLI``): ``--help`` lists its options.
"""

from lightning_kit.bench import main

from .cli import ProjectCLI

if __name__ == "__main__":
    main(cli_class=ProjectCLI)
