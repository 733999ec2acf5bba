"""Train, validate, test or predict: `python train.py --help`."""

try:
    from {{ cookiecutter.project_slug }}.cli import main
except ModuleNotFoundError as err:
    if err.name != "{{ cookiecutter.project_slug }}":
        raise
    raise SystemExit(f'error: {err.name} is not installed: run pip install -e ".[dev]" in this folder first') from None

if __name__ == "__main__":
    main()
