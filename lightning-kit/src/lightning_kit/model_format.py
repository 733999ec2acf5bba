"""What an exported model file holds beside its program: the names of its extra files and the kinds of input.

The export (``lightning_kit.export``) writes them and the server (``lightning_kit.serve``) reads them;
kept here, in the standard library alone, so that serving a model file imports no Lightning.
"""

# The extra files of a ``.pt2``: the class names (a JSON list) and what the inputs are (JSON: their kind and sizes).
CLASS_NAMES_FILE = "class_names.json"
INPUT_FILE = "input.json"
# The kinds of input an exported file takes (``INPUT_FILE``'s "kind"), decided by the data module.
IMAGES = "images"  # uint8 (batch, 3, image_size, image_size): the data module has an image_size
TOKENS = "tokens"  # int64 (batch, length), ids in [0, vocab_size): the data module has a seq_len and a vocab_size
# The command that writes model files, named in messages (a project's server names its own, ``<package>.export``).
EXPORT_COMMAND = "python -m lightning_kit.export"
