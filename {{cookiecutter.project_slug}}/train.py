"""Train, validate, test or predict: `python train.py --help`."""

from {{ cookiecutter.project_slug }}.cli import main

if __name__ == "__main__":
    main()
