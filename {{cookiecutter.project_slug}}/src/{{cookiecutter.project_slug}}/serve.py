"""``python -m {{ cookiecutter.project_slug }}.serve``: the exported model behind HTTP with LitServe, batching concurrent requests.

lightning_kit's command, run with this project's command line (``cli.ProjectCLI``): ``--help`` lists its options.
"""

from lightning_kit.serve.command import main

from .cli import ProjectCLI

if __name__ == "__main__":
    main(cli_class=ProjectCLI)
