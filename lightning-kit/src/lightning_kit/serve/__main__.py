"""``python -m lightning_kit.serve MODEL``: serve an exported model over HTTP (a project's own: ``<package>.serve``)."""

from .command import main

if __name__ == "__main__":
    main()
